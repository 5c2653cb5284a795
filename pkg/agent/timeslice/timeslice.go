// Package timeslice sets the driver's compute time slice on time-shared
// GPUs, the one way NVIDIA's driver offers on bare metal: `nvidia-smi
// compute-policy -i <GPU> --set-timeslice <class>`. NVML has a time-slice
// call for vGPU only.
//
// The driver takes a class, not a length: 0 default, 1 short, 2 medium,
// 3 long, and it does not publish how long each is. Tessera's configuration
// speaks in lengths (timeSlice.computeBound, timeSlice.ioBound, from the
// source material), so ClassOf keeps their order instead of pretending to a
// conversion: the longer configured length gets the long class, a shorter
// one the medium class. Short is left alone on purpose: its length is
// unknown and a slice too short for a kernel costs every tenant a context
// switch.
//
// The class is per GPU, so one GPU's tenants share it: a GPU with any
// inference (IO-bound, latency-sensitive) tenant gets the IO-bound length,
// any other the compute-bound one.
package timeslice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

// Class is one of the driver's time-slice classes, numbered as nvidia-smi
// takes them.
type Class int

// The driver's classes.
const (
	Default Class = 0
	Short   Class = 1
	Medium  Class = 2
	Long    Class = 3
)

func (c Class) String() string {
	switch c {
	case Default:
		return "default"
	case Short:
		return "short"
	case Medium:
		return "medium"
	case Long:
		return "long"
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// ClassOf is the class for a GPU whose tenants include an IO-bound one
// (ioBound) or not, under cfg: the longer of the two configured lengths
// maps to Long, the shorter to Medium, equal lengths both to Long.
func ClassOf(cfg config.TimeSliceConfig, ioBound bool) Class {
	mine, other := cfg.ComputeBound.Duration, cfg.IOBound.Duration
	if ioBound {
		mine, other = other, mine
	}
	if mine >= other {
		return Long
	}
	return Medium
}

// Setter applies a class to one GPU.
type Setter interface {
	SetTimeslice(ctx context.Context, uuid string, c Class) error
}

// DefaultNvidiaSMI is the driver's management program.
const DefaultNvidiaSMI = "nvidia-smi"

// NvidiaSMI sets classes through the driver's nvidia-smi.
type NvidiaSMI struct {
	// Path is the program (found on $PATH when it has no slash).
	Path string
}

// SetTimeslice runs `nvidia-smi compute-policy -i <uuid> --set-timeslice <c>`.
func (n NvidiaSMI) SetTimeslice(ctx context.Context, uuid string, c Class) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Path, "compute-policy", "-i", uuid, "--set-timeslice", strconv.Itoa(int(c)))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Recorder is a Setter that only remembers: the playground's, whose GPUs
// are NVML mocks with no driver behind them.
type Recorder struct {
	mu   sync.Mutex
	set  map[string]Class
	fail error
}

// Fail makes every SetTimeslice from now on fail with err, as nvidia-smi
// does on a driver that refuses the setting; nil makes them succeed again.
func (r *Recorder) Fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = err
}

// SetTimeslice records c for uuid, or fails as Fail says.
func (r *Recorder) SetTimeslice(_ context.Context, uuid string, c Class) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	if r.set == nil {
		r.set = map[string]Class{}
	}
	r.set[uuid] = c
	return nil
}

// Get is the class last set on uuid.
func (r *Recorder) Get(uuid string) (Class, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.set[uuid]
	return c, ok
}

// Change is one class applied, or one that failed to apply.
type Change struct {
	GPU      string
	From, To Class
	// First: nothing had been applied to the GPU by this agent before.
	First bool
	Err   error
}

// Manager keeps each GPU at the class it should have, calling the Setter
// only when that changes, and retrying a failure no sooner than Retry
// later: nvidia-smi is a process start, and a node where it cannot work
// must not run it twice a second.
type Manager struct {
	Setter Setter
	Retry  time.Duration

	mu      sync.Mutex
	applied map[string]Class
	failed  map[string]time.Time
}

// NewManager returns a manager over s.
func NewManager(s Setter, retry time.Duration) *Manager {
	return &Manager{Setter: s, Retry: retry, applied: map[string]Class{}, failed: map[string]time.Time{}}
}

// Applied is the class this manager last applied to uuid.
func (m *Manager) Applied(uuid string) (Class, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.applied[uuid]
	return c, ok
}

// Apply brings every GPU of want to its class, in the order given, and
// reports what it changed or failed to.
func (m *Manager) Apply(ctx context.Context, gpus []string, want map[string]Class, now time.Time) []Change {
	var out []Change
	for _, uuid := range gpus {
		to, ok := want[uuid]
		if !ok {
			continue
		}
		m.mu.Lock()
		from, had := m.applied[uuid]
		last, failedBefore := m.failed[uuid]
		m.mu.Unlock()
		if had && from == to {
			continue
		}
		if failedBefore && now.Sub(last) < m.Retry {
			continue
		}
		err := m.Setter.SetTimeslice(ctx, uuid, to)
		m.mu.Lock()
		if err != nil {
			m.failed[uuid] = now
		} else {
			delete(m.failed, uuid)
			m.applied[uuid] = to
		}
		m.mu.Unlock()
		out = append(out, Change{GPU: uuid, From: from, To: to, First: !had, Err: err})
	}
	return out
}

// ErrNoNvidiaSMI says the driver's nvidia-smi is not where the agent looks.
var ErrNoNvidiaSMI = errors.New("nvidia-smi not found")

// Find resolves the nvidia-smi program: path itself when it has a slash,
// else a lookup on $PATH.
func Find(path string) (NvidiaSMI, error) {
	p, err := exec.LookPath(path)
	if err != nil {
		return NvidiaSMI{}, fmt.Errorf("%w (%q): time-slice classes cannot be applied; mount the driver's utilities (NVIDIA_DRIVER_CAPABILITIES=utility) or pass --nvidia-smi: %v", ErrNoNvidiaSMI, path, err)
	}
	return NvidiaSMI{Path: p}, nil
}
