package allocator

import (
	"sort"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Occupy counts on GPU uuid what one holder outside any pod assignment
// takes there — a DRA claim's device, whose pods the scheduler does not
// book: memMiB, coresPerMille, one tenant, in mode m. Like
// ForceAssignment it refuses nothing (the claim is allocated already; an
// over-full GPU only takes nothing more), and a GPU's mode stays the one
// it had. It reports whether the node has the GPU.
func (n *Node) Occupy(uuid string, memMiB int64, coresPerMille int, m gpu.SharingMode) bool {
	i := n.gpuByUUID(uuid)
	if i < 0 {
		return false
	}
	u := &n.GPUs[i].use
	u.mem += memMiB
	u.cores += int32(coresPerMille)
	u.tenants++
	if md, err := modeOf(m); err == nil && u.mode == modeNone {
		u.mode = md
	}
	n.Version++
	return true
}

// Rank orders n's GPUs for r, a request for one GPU (a DRA claim's
// device: one slice, or one whole GPU): the GPU the policy places r on
// first, then the next best, and so on; then the GPUs r fits nowhere by
// this account, in the node's order. Positions are in n.GPUs. score is the
// first placement's score, ok false where r fits no GPU of n. The node's
// DRA mark is ignored: claims are what a DRA node serves. n is not
// changed.
//
// A slice is scored on every GPU in one pass, as Place scores its
// candidates (the same score, ties to the lower position); a whole GPU,
// which Place chooses with the node's topology, by placing again with
// each chosen GPU taken away.
func (a *Allocator) Rank(n *Node, r *Request) (order []int, score float64, ok bool) {
	if len(r.Containers) == 1 && r.Containers[0].Count == 1 && !r.Containers[0].Whole {
		return a.rankSlice(n, r)
	}
	c := n.Clone()
	c.DRA = false
	var p Placement
	ranked := uint64(0)
	for range c.GPUs {
		if !a.Place(c, r, &p).OK() || len(p.Grants) == 0 {
			break
		}
		i := p.Grants[0].GPU
		if len(order) == 0 {
			score, ok = p.Score, true
		}
		order = append(order, i)
		ranked |= 1 << uint(i)
		c.GPUs[i].Healthy = false
	}
	for i := range c.GPUs {
		if ranked&(1<<uint(i)) == 0 {
			order = append(order, i)
		}
	}
	return order, score, ok
}

// rankSlice is Rank for one slice: place's candidate loop, every
// candidate's score kept.
func (a *Allocator) rankSlice(n *Node, r *Request) (order []int, score float64, ok bool) {
	type scored struct {
		gpu   int
		score float64
	}
	var fits []scored
	cpuFree, memFree := n.CPUMilli-n.CPUUsed-r.CPUMilli, n.MemoryMiB-n.MemUsed-r.MemoryMiB
	if cpuFree >= 0 && memFree >= 0 {
		var after [MaxGPUsPerNode]usage
		for i := range n.GPUs {
			after[i] = n.GPUs[i].use
		}
		var st *fragState
		if a.usesFrag() {
			st = &fragState{}
			a.workload.prepare(n, a.oversub, st)
		}
		c := &r.Containers[0]
		for i := range n.GPUs {
			m, mem, cores, fit := sliceFits(r, c, &n.GPUs[i], after[i], a.oversub)
			if !fit {
				continue
			}
			saved := after[i]
			after[i] = usage{mem: saved.mem + mem, cores: saved.cores + int32(cores), tenants: saved.tenants + 1, mode: m}
			fits = append(fits, scored{i, a.score(n, st, &after, 1<<uint(i), i, cpuFree, memFree)})
			after[i] = saved
		}
	}
	sort.SliceStable(fits, func(i, j int) bool { return fits[i].score > fits[j].score })
	ranked := uint64(0)
	for _, f := range fits {
		order = append(order, f.gpu)
		ranked |= 1 << uint(f.gpu)
	}
	for i := range n.GPUs {
		if ranked&(1<<uint(i)) == 0 {
			order = append(order, i)
		}
	}
	if len(fits) == 0 {
		return order, 0, false
	}
	return order, fits[0].score, true
}
