package allocator

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation:
// Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
// USENIX ATC'23).
//
// A node's fragmentation against a target workload M is the expected amount of
// its free GPU compute that a task drawn from M could not use:
//
//	F_n(M) = Σ_m p_m · F_n(m)
//
// where, for a task shape m:
//   - if m needs no GPU, or the node cannot host m at all (CPU, memory, too few
//     GPUs that fit it, model not allowed), all free GPU compute is fragment;
//   - otherwise the free compute of the GPUs that cannot take m is fragment.
//
// FGD places each pod where F grows least (the fragmentation gradient). Units
// here are per-mille of a GPU, as the paper's milli-GPU.

// MaxShapes bounds the target workload: the most common shapes beyond it carry
// too little weight to change a decision, and the bound keeps scratch space on
// the stack.
const MaxShapes = 64

// Workload is a target workload: request shapes and their probabilities.
type Workload struct {
	shapes  []Request
	weights []float64
	// groups are the distinct GPU parts of the shapes (count, slice, mode,
	// models): shapes that differ only in CPU or memory fit the same GPUs, so
	// which GPUs fit is worked out once per group.
	groups []Request
	// group[m] is shape m's group, or -1 for a CPU-only shape.
	group []int
	// cpuOnly is the total weight of CPU-only shapes.
	cpuOnly float64
	// gpuShapes holds, flat, what total needs of each GPU shape.
	gpuShapes []gpuShape
}

type gpuShape struct {
	group         int
	count         int
	cpuMilli, mem int64
	weight        float64
}

// ShapeCount is a request shape and how often it was seen.
type ShapeCount struct {
	Request *Request
	Count   float64
}

// NewWorkload keeps the most common shapes that together cover `coverage` of
// all counted requests (at most MaxShapes), and renormalises their weights.
// Equal counts are ordered by shape key, so the result does not depend on the
// order of counts. Multi-container requests are reduced to their GPU demand:
// one container holding all their GPUs, shaped as the first GPU container.
func NewWorkload(counts []ShapeCount, coverage float64) (*Workload, error) {
	if coverage <= 0 || coverage > 1 {
		return nil, fmt.Errorf("%w: workload coverage %v must be in (0, 1]", gpu.ErrInvalid, coverage)
	}
	type entry struct {
		req   Request
		key   string
		count float64
	}
	merged := map[string]*entry{}
	var total float64
	for _, sc := range counts {
		if sc.Count <= 0 {
			continue
		}
		if err := sc.Request.Check(); err != nil {
			return nil, err
		}
		r := shapeOf(sc.Request)
		k := r.Key()
		if e := merged[k]; e != nil {
			e.count += sc.Count
		} else {
			merged[k] = &entry{req: r, key: k, count: sc.Count}
		}
		total += sc.Count
	}
	entries := make([]*entry, 0, len(merged))
	for _, e := range merged {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(x, y *entry) int {
		if c := cmp.Compare(y.count, x.count); c != 0 {
			return c
		}
		return cmp.Compare(x.key, y.key)
	})
	w := &Workload{}
	var covered float64
	for _, e := range entries {
		if covered >= coverage*total || len(w.shapes) == MaxShapes {
			break
		}
		w.shapes = append(w.shapes, e.req)
		w.weights = append(w.weights, e.count)
		covered += e.count
	}
	for i := range w.weights {
		w.weights[i] /= covered
	}
	w.index()
	return w, nil
}

// index builds the GPU-part groups.
func (w *Workload) index() {
	ids := map[string]int{}
	w.group = make([]int, len(w.shapes))
	for m := range w.shapes {
		sh := &w.shapes[m]
		if len(sh.Containers) == 0 {
			w.group[m] = -1
			w.cpuOnly += w.weights[m]
			continue
		}
		part := Request{Sharing: sh.Sharing, Models: sh.Models, Containers: sh.Containers, MemoryHard: sh.MemoryHard}
		k := part.Key()
		id, ok := ids[k]
		if !ok {
			id = len(w.groups)
			ids[k] = id
			w.groups = append(w.groups, part)
		}
		w.group[m] = id
		w.gpuShapes = append(w.gpuShapes, gpuShape{group: id, count: sh.Containers[0].Count, cpuMilli: sh.CPUMilli, mem: sh.MemoryMiB, weight: w.weights[m]})
	}
}

// shapeOf reduces a request to a single GPU container for the workload model.
func shapeOf(r *Request) Request {
	s := Request{CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, Sharing: r.Sharing, Models: r.Models, MemoryHard: r.MemoryHard}
	for _, c := range r.Containers {
		if c.Count == 0 {
			continue
		}
		if len(s.Containers) == 0 {
			c.Name = ""
			s.Containers = append(s.Containers, c)
		} else {
			s.Containers[0].Count += c.Count
		}
	}
	return s
}

// Len is the number of shapes kept.
func (w *Workload) Len() int { return len(w.shapes) }

// Shape returns shape i and its probability.
func (w *Workload) Shape(i int) (Request, float64) { return w.shapes[i], w.weights[i] }

// fragState is a node's fragmentation before a placement, per shape group,
// so that a candidate placement is scored by looking only at the GPUs it
// changes.
type fragState struct {
	free int64   // free compute of healthy GPUs
	frag float64 // F_n(M)
	// shared says a GPU of the node already runs sharing pods.
	shared bool
	// fits[g] marks the GPUs that fit group g; fitFree[g] is their free compute.
	fits    [MaxShapes]uint64
	fitFree [MaxShapes]int64
}

// prepare computes n's fragmentation state.
func (w *Workload) prepare(n *Node, oversub float64, st *fragState) {
	st.free = n.GPUFree()
	st.shared = false
	for i := range n.GPUs {
		if m := n.GPUs[i].use.mode; m == modeMPS || m == modeTimeSlicing {
			st.shared = true
		}
	}
	for k := range w.groups {
		gr := &w.groups[k]
		c := &gr.Containers[0]
		var mask uint64
		var fitFree int64
		for i := range n.GPUs {
			g := &n.GPUs[i]
			if shapeFits(gr, c, g, g.use, oversub) {
				mask |= 1 << uint(i)
				fitFree += g.freeCores()
			}
		}
		st.fits[k], st.fitFree[k] = mask, fitFree
	}
	st.frag = w.total(&st.fits, &st.fitFree, st.free, n.CPUMilli-n.CPUUsed, n.MemoryMiB-n.MemUsed)
}

// total is F_n(M) = Σ p_m F_n(m) given which GPUs fit each group.
func (w *Workload) total(fits *[MaxShapes]uint64, fitFree *[MaxShapes]int64, free, cpuFree, memFree int64) float64 {
	frag := w.cpuOnly * float64(free)
	for i := range w.gpuShapes {
		sh := &w.gpuShapes[i]
		f := free
		if cpuFree >= sh.cpuMilli && memFree >= sh.mem && bits.OnesCount64(fits[sh.group]) >= sh.count {
			f -= fitFree[sh.group]
		}
		frag += sh.weight * float64(f)
	}
	return frag
}

// shapeFits reports whether one GPU of shape sh fits GPU g in state u.
// The cheap integer checks come first: this runs shapes × GPUs times per node.
func shapeFits(sh *Request, c *Container, g *GPU, u usage, oversub float64) bool {
	if !g.Healthy {
		return false
	}
	if c.Whole {
		return u.tenants == 0 && g.MemoryMiB >= max(c.MemoryMiB, c.MinMemoryMiB) && sh.allows(g.Model)
	}
	if int64(c.Cores) > gpu.CoresPerGPU-int64(u.cores) {
		return false
	}
	_, _, _, ok := sliceFits(sh, c, g, u, oversub)
	return ok
}

// reduction is F_n(M) before minus after the placement: FGD's score.
func (w *Workload) reduction(n *Node, st *fragState, after *[MaxGPUsPerNode]usage, changed uint64, cpuFree, memFree int64, oversub float64) float64 {
	return st.frag - w.fragAfter(n, st, after, changed, cpuFree, memFree, oversub)
}

// fragAfter is F_n(M) with the placement applied.
func (w *Workload) fragAfter(n *Node, st *fragState, after *[MaxGPUsPerNode]usage, changed uint64, cpuFree, memFree int64, oversub float64) float64 {
	free := st.free
	for c := changed; c != 0; c &= c - 1 {
		i := bits.TrailingZeros64(c)
		free -= int64(after[i].cores) - int64(n.GPUs[i].use.cores)
	}
	fits, fitFree := st.fits, st.fitFree
	for k := range w.groups {
		gr := &w.groups[k]
		c := &gr.Containers[0]
		// A placement only adds usage, so a GPU that did not fit the group
		// before does not fit it after: only GPUs in the mask need a look.
		for ch := changed & fits[k]; ch != 0; ch &= ch - 1 {
			i := bits.TrailingZeros64(ch)
			g := &n.GPUs[i]
			fitFree[k] -= g.freeCores()
			if shapeFits(gr, c, g, after[i], oversub) {
				fitFree[k] += gpu.CoresPerGPU - int64(after[i].cores)
			} else {
				fits[k] &^= 1 << uint(i)
			}
		}
	}
	return w.total(&fits, &fitFree, free, cpuFree, memFree)
}

// Fragmentation is n's expected fragmentation F_n(M) under w, per-mille of a GPU.
func (w *Workload) Fragmentation(n *Node, oversub float64) float64 {
	var st fragState
	w.prepare(n, oversub, &st)
	return st.frag
}
