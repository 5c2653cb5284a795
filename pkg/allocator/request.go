package allocator

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Container is one container's GPU demand, resolved for placement.
type Container struct {
	Name  string
	Count int
	// Whole containers take entire GPUs exclusively.
	Whole bool
	// MemoryMiB per GPU; 0 means "the same share of the GPU's memory as Cores
	// is of its SMs" (how the trace simulator maps gpu_milli).
	MemoryMiB int64
	// Cores per GPU, per-mille; 0 means "the same share of the SMs as MemoryMiB
	// is of the GPU's memory", so compute stays accounted and never oversubscribed.
	Cores int
	// MinMemoryMiB is the workload class's minimum slice; a smaller slice is
	// rounded up to it.
	MinMemoryMiB int64
}

// Request is a pod's demand as the allocator uses it. podgpu.Request reads
// one from a pod (its package doc maps what a user writes to these fields);
// the simulator builds them directly and checks them with Check.
type Request struct {
	CPUMilli  int64
	MemoryMiB int64
	// Sharing is auto, exclusive, mps or time-slicing.
	Sharing    gpu.SharingMode
	Models     []string
	Containers []Container
	Priority   int32
	// MemoryHard: slices only on GPUs where the kernel holds their memory
	// (time-sliced GPUs offering NVML cgroup limits); whole GPUs anywhere.
	MemoryHard bool
}

// Check validates a request built directly (the simulator builds them from
// its traces). Requests from pods come from podgpu.Request, which validates
// them in the user's terms and always returns one that passes Check.
func (r *Request) Check() error {
	if r.CPUMilli < 0 || r.MemoryMiB < 0 {
		return fmt.Errorf("%w: negative cpu (%d) or memory (%d)", gpu.ErrInvalid, r.CPUMilli, r.MemoryMiB)
	}
	switch r.Sharing {
	case gpu.ModeAuto, gpu.ModeExclusive, gpu.ModeMPS, gpu.ModeTimeSlicing:
	default:
		return fmt.Errorf("%w: sharing mode %q", gpu.ErrInvalid, r.Sharing)
	}
	total := 0
	for i, c := range r.Containers {
		switch {
		case c.Count < 0:
			return fmt.Errorf("%w: container %d asks for %d GPUs", gpu.ErrInvalid, i, c.Count)
		case c.Count > MaxGPUsPerNode:
			return fmt.Errorf("%w: container %d asks for %d GPUs; no node has more than %d", gpu.ErrInvalid, i, c.Count, MaxGPUsPerNode)
		case c.Cores < 0 || c.Cores > gpu.CoresPerGPU:
			return fmt.Errorf("%w: container %d asks for %d‰ of a GPU's cores", gpu.ErrInvalid, i, c.Cores)
		case c.MemoryMiB < 0 || c.MinMemoryMiB < 0:
			return fmt.Errorf("%w: container %d asks for negative GPU memory", gpu.ErrInvalid, i)
		case c.Count > 0 && !c.Whole && c.Cores == 0 && c.MemoryMiB == 0:
			return fmt.Errorf("%w: container %d shares a GPU but gives neither memory nor cores", gpu.ErrInvalid, i)
		}
		total += c.Count
	}
	if total > MaxGPUsPerNode {
		return fmt.Errorf("%w: %d GPUs in one pod; no node has more than %d", gpu.ErrInvalid, total, MaxGPUsPerNode)
	}
	return nil
}

// GPUs is the number of GPUs the pod needs.
func (r *Request) GPUs() int {
	n := 0
	for _, c := range r.Containers {
		n += c.Count
	}
	return n
}

// GPUDemand is the pod's GPU demand in per-mille of a GPU: whole GPUs count
// 1000 each, a slice counts its cores. Memory-only slices count 0 here, since
// their compute share depends on the GPU they land on.
func (r *Request) GPUDemand() int64 {
	var d int64
	for _, c := range r.Containers {
		if c.Whole {
			d += int64(c.Count) * gpu.CoresPerGPU
		} else {
			d += int64(c.Count) * int64(c.Cores)
		}
	}
	return d
}

// FitIgnoresWorkload says whether Place's answer for r — whether it fits a
// node, and if not the Reason — is the same under every target workload
// (WithWorkload), so a caller may keep that answer when only the workload
// changed. It holds when at most one container asks for GPUs: the GPUs its
// slices may take are each decided on that GPU's own state, and the score
// only picks among them. With two or more, the GPUs an earlier container
// took, chosen by score, can decide whether a later one fits.
func (r *Request) FitIgnoresWorkload() bool {
	n := 0
	for i := range r.Containers {
		if r.Containers[i].Count > 0 {
			n++
		}
	}
	return n <= 1
}

// Key identifies the request's shape: two requests with equal keys place
// identically on any node. Caches and the workload model key on it.
func (r *Request) Key() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(r.CPUMilli, 10))
	b.WriteByte('/')
	b.WriteString(strconv.FormatInt(r.MemoryMiB, 10))
	b.WriteByte('/')
	b.WriteString(string(r.Sharing))
	b.WriteByte('/')
	b.WriteString(strings.Join(r.Models, "|"))
	if r.MemoryHard {
		b.WriteString("/hard")
	}
	for _, c := range r.Containers {
		fmt.Fprintf(&b, "/%d,%t,%d,%d,%d", c.Count, c.Whole, c.MemoryMiB, c.Cores, c.MinMemoryMiB)
	}
	return b.String()
}

func (r *Request) allows(model string) bool {
	if len(r.Models) == 0 {
		return true
	}
	for _, m := range r.Models {
		if m == model {
			return true
		}
	}
	return false
}

// slice resolves a sharing container's memory and cores on a GPU.
func (c *Container) slice(g *GPU) (mem int64, cores int64) {
	mem, cores = c.MemoryMiB, int64(c.Cores)
	if mem == 0 {
		mem = g.MemoryMiB * cores / gpu.CoresPerGPU
	}
	if mem < c.MinMemoryMiB {
		mem = c.MinMemoryMiB
	}
	if cores == 0 {
		cores = (mem*gpu.CoresPerGPU + g.MemoryMiB - 1) / g.MemoryMiB
	}
	if mem == 0 {
		// A tiny share of a small GPU still occupies memory.
		mem = 1
	}
	return mem, cores
}
