package sim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// ModelCeiling is an upper bound on the allocation any placement of one
// seed's arrivals can have at 100 % arrived demand, whatever the policy and
// whatever it declines: the optimum of a linear relaxation that accounts
// for what Ceiling leaves out — GPU models (gpu_spec), each node type's
// CPU and memory, multi-GPU pods — as well as the fragments sharing pods
// leave on their GPUs (placementBound). Every real placement is a point of
// the relaxation, so the bound is above every run; being a relaxation, it
// can be loose, never wrong.
type ModelCeiling struct {
	Seed uint64
	// At100 is the bound (% of capacity) at the last arrival whose
	// arrived demand rounds to 100 % of capacity: allocation only grows
	// with arrivals, so it bounds every arrival of that column, and so
	// Result.At100 (their mean).
	At100 float64
	// Shapes and NodeTypes are the relaxation's size; Took its solving
	// time.
	Shapes, NodeTypes int
	Took              time.Duration
}

// nodeType is nodes alike for the relaxation.
type nodeType struct {
	model    string
	gpus     int
	cpu, mem int64
	count    int
}

// ModelCeilingOf computes the ModelCeiling of one seed's arrivals at tune.
func (t *Trace) ModelCeilingOf(seed uint64, tune float64) (ModelCeiling, error) {
	start := time.Now()
	capacity := int64(t.gpus) * gpu.CoresPerGPU
	c := ModelCeiling{Seed: seed, At100: math.NaN()}
	// The arrivals up to the last one of column 100 (as in Run, a large pod
	// that jumps over the column does not count).
	var arrived int64
	var upTo []int
	for _, pi := range t.Arrivals(seed, tune) {
		p := t.Pods[pi]
		if int(math.Round(100*float64(arrived+p.Demand())/float64(capacity))) > 100 {
			break
		}
		arrived += p.Demand()
		upTo = append(upTo, pi)
	}
	if int(math.Round(100*float64(arrived)/float64(capacity))) < 100 {
		return c, nil // demand never reaches 100 %: no column to bound
	}
	bound, shapes, types, err := placementBound(t.Nodes, t.Pods, upTo)
	if err != nil {
		return c, err
	}
	c.At100 = 100 * bound / float64(capacity)
	c.Shapes, c.NodeTypes, c.Took = shapes, types, time.Since(start)
	return c, nil
}

// item is a pod shape for the relaxation: what one pod asks, and how
// many arrived. A sharing item (one GPU, less than all of it) is packed
// with others into GPUs; a whole one takes gpus whole GPUs. A pod asking
// several GPUs, each in part, is relaxed to that many sharing items (its
// GPUs need not be on one node, nor distinct).
type item struct {
	cpu, mem    float64 // per item
	milli       int64   // per GPU
	gpus        int     // whole items: GPUs per pod
	models      []string
	count       float64
	sharing     bool
	perNodeGPUs int // the GPUs a node needs to hold it
}

// value is what placing one item allocates, in milli-GPUs.
func (it item) value() float64 {
	if it.sharing {
		return float64(it.milli)
	}
	return float64(it.gpus) * gpu.CoresPerGPU
}

func (it item) allowed(nt nodeType) bool {
	return it.perNodeGPUs <= nt.gpus && (len(it.models) == 0 || slices.Contains(it.models, nt.model))
}

// pattern is one GPU of a node type packed with sharing items: how many
// of each, by item index (a slice, so that sums over it run in one order
// and the relaxation comes out the same every run).
type pattern struct {
	k     int
	count []int
}

// placementBound bounds from above, in milli-GPUs, the allocation of any
// placement of the pods listed (indexes into pods, repeats allowed) on
// nodes. It is Gilmore and Gomory's cutting-stock relaxation extended to
// node types: variables are, per node type, how many GPUs are filled with
// each packing pattern of sharing pods and how many whole-GPU pods land
// there; rows are each shape's count and each type's GPUs, CPU and
// memory. Patterns are generated as needed (a knapsack per type prices the
// best one), and the bound is the Lagrangian one of the last prices: the
// count, CPU and memory rows priced, each type's GPUs filled with the best
// pattern or whole pod at those prices. Any prices give an upper bound;
// the optimal ones give the relaxation's optimum.
func placementBound(nodes []NodeSpec, pods []PodSpec, listed []int) (float64, int, int, error) {
	var types []nodeType
	for _, n := range nodes {
		if n.GPUs == 0 {
			continue
		}
		i := slices.IndexFunc(types, func(k nodeType) bool {
			return k.model == n.Model && k.gpus == n.GPUs && k.cpu == n.CPUMilli && k.mem == n.MemoryMiB
		})
		if i < 0 {
			types = append(types, nodeType{model: n.Model, gpus: n.GPUs, cpu: n.CPUMilli, mem: n.MemoryMiB})
			i = len(types) - 1
		}
		types[i].count++
	}
	var items []item
	index := map[string]int{}
	for _, pi := range listed {
		p := pods[pi]
		if p.NumGPU == 0 {
			continue // no GPU to allocate: placing it never raises the bound
		}
		key := fmt.Sprint(p.CPUMilli, p.MemoryMiB, p.NumGPU, p.GPUMilli, p.Models)
		i, ok := index[key]
		if !ok {
			it := item{milli: p.GPUMilli, models: p.Models, perNodeGPUs: p.NumGPU}
			if p.GPUMilli < gpu.CoresPerGPU {
				it.sharing = true
				it.cpu, it.mem = float64(p.CPUMilli)/float64(p.NumGPU), float64(p.MemoryMiB)/float64(p.NumGPU)
			} else {
				it.gpus, it.cpu, it.mem = p.NumGPU, float64(p.CPUMilli), float64(p.MemoryMiB)
			}
			i = len(items)
			index[key] = i
			items = append(items, it)
		}
		if items[i].sharing {
			items[i].count += float64(p.NumGPU)
		} else {
			items[i].count++
		}
	}
	if len(items) == 0 || len(types) == 0 {
		return 0, len(items), len(types), nil
	}
	var patterns []pattern
	for k, nt := range types {
		for s, it := range items {
			if it.sharing && it.allowed(nt) {
				p := pattern{k: k, count: make([]int, len(items))}
				p.count[s] = int(min(it.count, float64(gpu.CoresPerGPU/it.milli)))
				patterns = append(patterns, p)
			}
		}
	}
	best := math.Inf(1)
	for range 500 {
		prices, err := masterDuals(types, items, patterns)
		if err != nil {
			return 0, len(items), len(types), err
		}
		bound, added := priceOut(types, items, prices, &patterns)
		best = min(best, bound)
		if !added {
			break
		}
	}
	return best, len(items), len(types), nil
}

// prices are the master's dual prices per unit: of one item of each
// shape, and per node type of one GPU, one milli-CPU and one MiB.
type prices struct {
	item          []float64
	gpu, cpu, mem []float64
}

// masterDuals solves the restricted master (the patterns so far, and every
// allowed whole-pod column) and returns its dual prices per unit.
func masterDuals(types []nodeType, items []item, patterns []pattern) (prices, error) {
	nItems, nTypes := len(items), len(types)
	// Rows, each scaled to a right-hand side of 1: one per item's count,
	// then per type its GPUs, CPU and memory.
	rows := nItems + 3*nTypes
	gpuRow := func(k int) int { return nItems + 3*k }
	totalGPUs := func(k int) float64 { return float64(types[k].count * types[k].gpus) }
	totalCPU := func(k int) float64 { return float64(types[k].cpu) * float64(types[k].count) }
	totalMem := func(k int) float64 { return float64(types[k].mem) * float64(types[k].count) }
	capped := func(need, have float64) float64 {
		if have <= 0 {
			if need > 0 {
				return 2 // nothing to meet it: the column cannot be used
			}
			return 0
		}
		return need / have
	}
	type wholeColumn struct{ s, k int }
	var whole []wholeColumn
	for s, it := range items {
		for k, nt := range types {
			if !it.sharing && it.allowed(nt) {
				whole = append(whole, wholeColumn{s, k})
			}
		}
	}
	cols := len(patterns) + len(whole)
	A := make([][]float64, rows)
	for r := range A {
		A[r] = make([]float64, cols)
	}
	value := make([]float64, cols)
	for j, p := range patterns {
		var cpu, mem float64
		for s, n := range p.count {
			if n == 0 {
				continue
			}
			A[s][j] = float64(n) / items[s].count
			value[j] += float64(n) * items[s].value()
			cpu += float64(n) * items[s].cpu
			mem += float64(n) * items[s].mem
		}
		A[gpuRow(p.k)][j] = 1 / totalGPUs(p.k)
		A[gpuRow(p.k)+1][j] = capped(cpu, totalCPU(p.k))
		A[gpuRow(p.k)+2][j] = capped(mem, totalMem(p.k))
	}
	for i, w := range whole {
		j, it := len(patterns)+i, items[w.s]
		A[w.s][j] = 1 / it.count
		A[gpuRow(w.k)][j] = float64(it.gpus) / totalGPUs(w.k)
		A[gpuRow(w.k)+1][j] = capped(it.cpu, totalCPU(w.k))
		A[gpuRow(w.k)+2][j] = capped(it.mem, totalMem(w.k))
		value[j] = it.value()
	}
	b := make([]float64, rows)
	for r := range b {
		b[r] = 1
	}
	y, err := simplexDuals(A, b, value)
	if err != nil {
		return prices{}, fmt.Errorf("the placement relaxation: %w", err)
	}
	pr := prices{item: make([]float64, nItems), gpu: make([]float64, nTypes), cpu: make([]float64, nTypes), mem: make([]float64, nTypes)}
	for s := range items {
		pr.item[s] = y[s] / items[s].count
	}
	for k := range types {
		pr.gpu[k] = y[gpuRow(k)] / totalGPUs(k)
		if h := totalCPU(k); h > 0 {
			pr.cpu[k] = y[gpuRow(k)+1] / h
		}
		if h := totalMem(k); h > 0 {
			pr.mem[k] = y[gpuRow(k)+2] / h
		}
	}
	return pr, nil
}

// net is what placing one item of s on a node of type k gains at the
// prices: its value less the prices of its count, CPU and memory.
func (pr prices) net(items []item, s, k int) float64 {
	it := items[s]
	return it.value() - pr.item[s] - pr.cpu[k]*it.cpu - pr.mem[k]*it.mem
}

// priceOut is the Lagrangian bound at the prices — the count, CPU and
// memory rows priced, each type's GPUs each filled with the best pattern
// or whole pod at those prices, or left empty — and adds to patterns each
// type's best pattern where it would enter the master.
func priceOut(types []nodeType, items []item, pr prices, patterns *[]pattern) (float64, bool) {
	bound := 0.0
	for s := range items {
		bound += pr.item[s] * items[s].count
	}
	added := false
	for k, nt := range types {
		bound += pr.cpu[k]*float64(nt.cpu)*float64(nt.count) + pr.mem[k]*float64(nt.mem)*float64(nt.count)
		// A GPU's best use at these prices, per GPU.
		net := func(s int) float64 { return pr.net(items, s, k) }
		perGPU := 0.0
		var cand []int
		for s, it := range items {
			switch {
			case !it.allowed(nt):
			case !it.sharing:
				perGPU = max(perGPU, net(s)/float64(it.gpus))
			case net(s) > 0:
				cand = append(cand, s)
			}
		}
		best, packed := packOneGPU(items, cand, net)
		perGPU = max(perGPU, best)
		bound += perGPU * float64(nt.gpus*nt.count)
		if best-pr.gpu[k] > 1e-6*gpu.CoresPerGPU && len(cand) > 0 {
			*patterns = append(*patterns, pattern{k: k, count: packed})
			added = true
		}
	}
	return bound, added
}

// packOneGPU is the bounded knapsack of one GPU: the most net value of
// sharing items among cand (each at most its count, and as many as fit)
// within 1000 milli-GPUs, and how many of each it takes (by item index).
func packOneGPU(items []item, cand []int, net func(int) float64) (float64, []int) {
	const capacity = gpu.CoresPerGPU
	// Each item is split into binary bundles (1, 2, 4, … copies), then a
	// 0/1 knapsack over milli-GPU with the choices kept to rebuild the
	// pattern.
	type bundle struct {
		s, n   int
		weight int
		value  float64
	}
	var bundles []bundle
	for _, s := range cand {
		most := int(min(items[s].count, float64(capacity/items[s].milli)))
		for n := 1; most > 0; n *= 2 {
			take := min(n, most)
			bundles = append(bundles, bundle{s: s, n: take, weight: take * int(items[s].milli), value: float64(take) * net(s)})
			most -= take
		}
	}
	dp := make([]float64, capacity+1)
	took := make([][]bool, len(bundles))
	for i, bd := range bundles {
		took[i] = make([]bool, capacity+1)
		for w := capacity; w >= bd.weight; w-- {
			if v := dp[w-bd.weight] + bd.value; v > dp[w] {
				dp[w], took[i][w] = v, true
			}
		}
	}
	packed := make([]int, len(items))
	w := capacity
	for i := len(bundles) - 1; i >= 0; i-- {
		if took[i][w] {
			packed[bundles[i].s] += bundles[i].n
			w -= bundles[i].weight
		}
	}
	return dp[capacity], packed
}
