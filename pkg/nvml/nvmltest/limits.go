package nvmltest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// CgroupLimits is one mock GPU's per-cgroup memory limits, kept as the
// driver documents them (nvmlDeviceSetMemoryLimits_v1): set on a cgroup v2
// directory, which must exist (else ERROR_OPERATING_SYSTEM); a soft limit
// above the hard one or a limit above the GPU's memory is
// ERROR_INVALID_ARGUMENT; soft 0 with hard DEVICE_MEMORY_LIMIT_MAX clears
// them. Allocate simulates a process of a cgroup allocating GPU memory: the
// hard limits of its cgroup and of every ancestor hold. It is safe for
// concurrent use.
type CgroupLimits struct {
	total uint64

	mu     sync.Mutex
	limits map[string]limit
	used   map[string]uint64 // per cgroup, its own processes' allocations
	log    []Set
	// failNext, when set, is returned by the next set calls instead of
	// applying them.
	failNext []gonvml.Return
}

type limit struct{ soft, hard uint64 }

// Set is one SetMemoryLimits_v1 call as the mock received it.
type Set struct {
	Cgroup     string
	Soft, Hard uint64
	Ret        gonvml.Return
}

// Cleared says whether the call removed the cgroup's limits.
func (s Set) Cleared() bool { return s.Soft == 0 && s.Hard == gonvml.DEVICE_MEMORY_LIMIT_MAX }

// NewCgroupLimits returns an empty record for a GPU of total bytes.
func NewCgroupLimits(total uint64) *CgroupLimits {
	return &CgroupLimits{total: total, limits: map[string]limit{}, used: map[string]uint64{}}
}

// FailNext makes the next len(rets) set calls answer rets, in order,
// without applying them: a driver error at the worst moment.
func (c *CgroupLimits) FailNext(rets ...gonvml.Return) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failNext = append(c.failNext, rets...)
}

func (c *CgroupLimits) set(cgroup string, soft, hard uint64) gonvml.Return {
	c.mu.Lock()
	defer c.mu.Unlock()
	ret := gonvml.SUCCESS
	clear := soft == 0 && hard == gonvml.DEVICE_MEMORY_LIMIT_MAX
	switch fi, err := os.Stat(cgroup); {
	case len(c.failNext) > 0:
		ret, c.failNext = c.failNext[0], c.failNext[1:]
	case err != nil || !fi.IsDir():
		ret = gonvml.ERROR_OPERATING_SYSTEM
	case !clear && (soft > hard || hard > c.total):
		ret = gonvml.ERROR_INVALID_ARGUMENT
	case clear:
		delete(c.limits, filepath.Clean(cgroup))
	default:
		c.limits[filepath.Clean(cgroup)] = limit{soft, hard}
	}
	c.log = append(c.log, Set{Cgroup: cgroup, Soft: soft, Hard: hard, Ret: ret})
	return ret
}

func (c *CgroupLimits) get(cgroup string) (gonvml.MemoryLimits_v1, gonvml.Return) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := os.Stat(cgroup); err != nil {
		return gonvml.MemoryLimits_v1{}, gonvml.ERROR_OPERATING_SYSTEM
	}
	l, ok := c.limits[filepath.Clean(cgroup)]
	if !ok {
		return gonvml.MemoryLimits_v1{}, gonvml.ERROR_NOT_FOUND
	}
	return gonvml.MemoryLimits_v1{NameSpace: cgroup, SoftLimit: l.soft, HardLimit: l.hard, CurrentUsed: c.subtreeUsed(filepath.Clean(cgroup))}, gonvml.SUCCESS
}

// Limit is a cgroup's limits as last set; ok is false when none are.
func (c *CgroupLimits) Limit(cgroup string) (soft, hard uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.limits[filepath.Clean(cgroup)]
	return l.soft, l.hard, ok
}

// Cgroups lists the cgroups with limits in force, sorted.
func (c *CgroupLimits) Cgroups() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.limits))
	for cg := range c.limits {
		out = append(out, cg)
	}
	sort.Strings(out)
	return out
}

// Log is every set call so far, in order.
func (c *CgroupLimits) Log() []Set {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Set(nil), c.log...)
}

// ErrOutOfMemory is what Allocate returns past a limit: the driver's
// CUDA_ERROR_OUT_OF_MEMORY.
var ErrOutOfMemory = errors.New("CUDA_ERROR_OUT_OF_MEMORY")

// Allocate simulates a process of cgroup allocating bytes on the GPU: it
// fails with ErrOutOfMemory when the GPU is full or the allocation would
// take the cgroup or any ancestor past its hard limit.
func (c *CgroupLimits) Allocate(cgroup string, bytes uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cgroup = filepath.Clean(cgroup)
	var all uint64
	for _, u := range c.used {
		all += u
	}
	if all+bytes > c.total {
		return fmt.Errorf("%w: the GPU has %d of %d bytes free", ErrOutOfMemory, c.total-all, c.total)
	}
	for p := cgroup; ; p = filepath.Dir(p) {
		if l, ok := c.limits[p]; ok && c.subtreeUsed(p)+bytes > l.hard {
			return fmt.Errorf("%w: cgroup %s holds %d of its hard limit %d", ErrOutOfMemory, p, c.subtreeUsed(p), l.hard)
		}
		if p == "/" || p == "." {
			break
		}
	}
	c.used[cgroup] += bytes
	return nil
}

// Free releases what a cgroup's processes hold (they exited).
func (c *CgroupLimits) Free(cgroup string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.used, filepath.Clean(cgroup))
}

// subtreeUsed is what cgroup and its descendants hold; c.mu is held.
func (c *CgroupLimits) subtreeUsed(cgroup string) uint64 {
	var n uint64
	for cg, u := range c.used {
		if cg == cgroup || strings.HasPrefix(cg, cgroup+"/") {
			n += u
		}
	}
	return n
}
