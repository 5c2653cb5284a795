// Package health decides which GPUs may take slices, from the faults NVML
// reports: an XID critical error or a double-bit ECC error takes every slice
// of its GPU out of service at once, a GPU that stops answering (lost) is out
// until it answers again, and a faulted GPU returns only after a quiet period
// with no further fault. XIDs that applications cause (a kernel's illegal
// address, a watchdog timeout) are ignored by default: they say nothing about
// the GPU, and taking a GPU away from its other tenants for one tenant's bug
// would be worse than useless.
//
// The tracker is pure (the caller passes the time), so its behaviour is
// tested without clocks or NVML.
package health

import (
	"fmt"
	"sort"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/nvml"
)

// DefaultIgnoredXids and DefaultQuietPeriod are the configuration's
// (health.ignoredXids, health.quietPeriod; see pkg/apis/config).
var (
	DefaultIgnoredXids = config.DefaultIgnoredXids
	DefaultQuietPeriod = config.DefaultQuietPeriod
)

// Tracker keeps each GPU's health. It is safe for concurrent use.
type Tracker struct {
	ignored map[uint64]bool
	quiet   time.Duration

	mu   sync.Mutex
	gpus map[string]*state
}

type state struct {
	lastFault time.Time
	reason    string
	lost      bool
}

// New returns a tracker that ignores the given XIDs and returns a GPU after
// quiet without faults.
func New(ignoredXids []uint64, quiet time.Duration) *Tracker {
	t := &Tracker{ignored: map[uint64]bool{}, quiet: quiet, gpus: map[string]*state{}}
	for _, x := range ignoredXids {
		t.ignored[x] = true
	}
	return t
}

// Observe records an NVML event at now and says whether it counts as a
// fault. An event without a GPU (NVML reports some for the whole node)
// faults every GPU in all (the caller passes the node's GPUs) and every GPU
// the tracker has seen fault before.
func (t *Tracker) Observe(ev nvml.Event, now time.Time, all ...string) bool {
	var reason string
	switch {
	case ev.Type&gonvml.EventTypeXidCriticalError != 0:
		if t.ignored[ev.Xid] {
			return false
		}
		reason = fmt.Sprintf("XID %d", ev.Xid)
	case ev.Type&gonvml.EventTypeDoubleBitEccError != 0:
		reason = "double-bit ECC error"
	default:
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	uuids := []string{ev.UUID}
	if ev.UUID == "" {
		uuids = all
		for u := range t.gpus {
			uuids = append(uuids, u)
		}
	}
	for _, u := range uuids {
		s := t.get(u)
		s.lastFault, s.reason = now, reason
	}
	return true
}

// Fault takes a GPU out of service at now for a reason found outside NVML's
// events (a preempted pod's process that would not die); it returns after
// the quiet period like any fault.
func (t *Tracker) Fault(uuid string, now time.Time, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.get(uuid)
	s.lastFault, s.reason = now, reason
}

// Lost records that a GPU stopped answering (or vanished) at now.
func (t *Tracker) Lost(uuid string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.get(uuid)
	if !s.lost {
		s.lost, s.lastFault, s.reason = true, now, "GPU lost (not answering NVML)"
	}
}

// Answering records that a GPU answered NVML again; it still waits out the
// quiet period from its last fault.
func (t *Tracker) Answering(uuid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.gpus[uuid]; ok {
		s.lost = false
	}
}

func (t *Tracker) get(uuid string) *state {
	s, ok := t.gpus[uuid]
	if !ok {
		s = &state{}
		t.gpus[uuid] = s
	}
	return s
}

// Healthy says whether the GPU may take slices at now and, when it may not,
// why and until when at the earliest.
func (t *Tracker) Healthy(uuid string, now time.Time) (ok bool, reason string, until time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, known := t.gpus[uuid]
	if !known || s.lastFault.IsZero() {
		return true, "", time.Time{}
	}
	if s.lost {
		return false, s.reason, time.Time{}
	}
	until = s.lastFault.Add(t.quiet)
	if now.Before(until) {
		return false, s.reason, until
	}
	return true, "", time.Time{}
}

// Unhealthy lists the GPUs out of service at now, sorted.
func (t *Tracker) Unhealthy(now time.Time) []string {
	t.mu.Lock()
	uuids := make([]string, 0, len(t.gpus))
	for u := range t.gpus {
		uuids = append(uuids, u)
	}
	t.mu.Unlock()
	var out []string
	for _, u := range uuids {
		if ok, _, _ := t.Healthy(u, now); !ok {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return out
}
