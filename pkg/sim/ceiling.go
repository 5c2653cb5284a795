package sim

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Ceiling is an upper bound on the allocation any policy can reach on one
// seed's arrivals, for a policy that places every sharing pod it is given
// (one that declines a pod which fits is not a scheduler): sharing pods,
// each on one GPU, occupy at least SlicerGPUs whole GPUs whatever the
// placement, and the slivers left on those GPUs (SlicerGPUs minus the sharing
// pods' own demand) can be used by no whole-GPU pod. So allocation at an
// arrival is at most min(arrived demand, capacity − slivers).
//
// SlicerGPUs is a lower bound for one-dimensional bin packing of the
// sharing pods' milli-GPUs into GPUs of 1000, the larger of Martello and
// Toth's L2 and Gilmore and Gomory's linear relaxation: a true lower bound,
// not a heuristic's count. It leaves out everything else that can
// only lower the allocation further (GPU models, node CPU and memory, the
// online order), so the ceiling is loose, never wrong.
type Ceiling struct {
	Seed uint64
	// At100 is the ceiling (% of capacity) averaged, like Result.Curve, over
	// the arrivals at which arrived demand rounded to 100 % of capacity.
	At100 float64
	// Sharing pods arrived by 100 %, their demand and the GPUs they need
	// at least, and so the unusable slivers, in GPUs.
	SharingPods  int
	SharingGPUs  float64
	SlicerGPUs   int
	SliverGPUs   float64
	UnallocAt100 float64
}

// CeilingOf computes the ceiling of one seed's arrivals at tune.
func (t *Trace) CeilingOf(seed uint64, tune float64) Ceiling {
	capacity := int64(t.gpus) * gpu.CoresPerGPU
	c := Ceiling{Seed: seed}
	var counts [gpu.CoresPerGPU]int // sharing pods by milli-GPU
	var arrived, sharing int64
	var sum float64
	var n int
	var lp relaxation
	evaluate := func() {
		bins := max(binsLowerBound(&counts), lp.bound(&counts))
		slivers := int64(bins)*gpu.CoresPerGPU - sharing
		sum += 100 * float64(min(arrived, capacity-slivers)) / float64(capacity)
		n++
		c.SharingGPUs, c.SlicerGPUs = float64(sharing)/gpu.CoresPerGPU, bins
		c.SliverGPUs = float64(slivers) / gpu.CoresPerGPU
	}
	for _, pi := range t.Arrivals(seed, tune) {
		p := t.Pods[pi]
		k := int(math.Round(100 * float64(arrived+p.Demand()) / float64(capacity)))
		if k > 100 {
			// A large pod jumped over the column: as in Run, what is in
			// force at 100 % is the state before it arrived.
			if n == 0 {
				evaluate()
			}
			break
		}
		arrived += p.Demand()
		if p.NumGPU == 1 && p.GPUMilli < gpu.CoresPerGPU {
			counts[p.GPUMilli]++
			sharing += p.GPUMilli
			c.SharingPods++
		}
		if k == 100 {
			evaluate()
		}
	}
	c.At100 = math.NaN()
	if n > 0 {
		c.At100 = sum / float64(n)
		c.UnallocAt100 = float64(t.gpus) * (1 - c.At100/100)
	}
	return c
}

// sizesOf lists the item sizes present, ascending, with their counts.
func sizesOf(counts *[gpu.CoresPerGPU]int) (sizes, demand []int) {
	for s, k := range counts {
		if k > 0 && s > 0 {
			sizes = append(sizes, s)
			demand = append(demand, k)
		}
	}
	return sizes, demand
}

// binsLowerBound is the L2 bound (Martello & Toth 1990) on the bins of
// capacity 1000 that items of the given sizes (counts[s] items of size s)
// need: for each threshold a ≤ 500, items above 1000−a each need a bin of
// their own that no item of size ≥ a can share; items in (500, 1000−a] each
// need a bin too, and items in [a, 500] need whatever room those bins do not
// leave them.
func binsLowerBound(counts *[gpu.CoresPerGPU]int) int {
	const c = gpu.CoresPerGPU
	sizes, _ := sizesOf(counts)
	if len(sizes) == 0 {
		return 0
	}
	thresholds := []int{0}
	for _, s := range sizes {
		if s <= c/2 {
			thresholds = append(thresholds, s)
		}
	}
	best := 0
	for _, a := range thresholds {
		var big, mid, midRoom, small int64
		for _, s := range sizes {
			k := int64(counts[s])
			switch {
			case s > c-a:
				big += k
			case s > c/2:
				mid += k
				midRoom += k * int64(c-s)
			case s >= a:
				small += k * int64(s)
			}
		}
		l := big + mid
		if over := small - midRoom; over > 0 {
			l += (over + c - 1) / c
		}
		best = max(best, int(l))
	}
	return best
}

// lpBinsLowerBound is Gilmore and Gomory's bound: the linear relaxation of
// the cutting-stock formulation (choose how many GPUs to fill with each
// packing pattern), which is rarely more than one GPU below the optimum.
// It solves the relaxation's dual, max Σ count·y subject to Σ y ≤ 1 over the
// items of every pattern, adding the pattern a knapsack finds most violated
// until none is. By weak duality any y all patterns respect bounds the
// optimum from below, and y is scaled to respect the last knapsack's exactly,
// so the bound holds even if the loop stops early.
func lpBinsLowerBound(counts *[gpu.CoresPerGPU]int) int {
	return new(relaxation).bound(counts)
}

// relaxation keeps the patterns found so far, so that bounding a growing
// set of items (one arrival more each time) needs only a few new ones.
type relaxation struct {
	// patterns are milli-GPU sizes packed together on one GPU, with
	// repeats.
	patterns [][]int
}

func (r *relaxation) bound(counts *[gpu.CoresPerGPU]int) int {
	sizes, demand := sizesOf(counts)
	index := make(map[int]int, len(sizes))
	for i, s := range sizes {
		index[s] = i
	}
	m := len(sizes)
	if m == 0 {
		return 0
	}
	// The known patterns, trimmed to the items there are; then one per
	// size: as many copies as fit.
	var patterns [][]int
	add := func(p []int) {
		if slices.ContainsFunc(patterns, func(q []int) bool { return slices.Equal(p, q) }) {
			return
		}
		patterns = append(patterns, p)
	}
	for _, items := range r.patterns {
		p := make([]int, m)
		for _, s := range items {
			if i, ok := index[s]; ok && p[i] < demand[i] {
				p[i]++
			}
		}
		add(p)
	}
	for i, s := range sizes {
		p := make([]int, m)
		p[i] = min(demand[i], gpu.CoresPerGPU/s)
		add(p)
	}
	bound := 0.0
	for range 1000 {
		y, ok := solveDual(patterns, demand)
		if !ok {
			break
		}
		best, value := knapsack(sizes, demand, y)
		total := 0.0
		for i := range y {
			total += float64(demand[i]) * y[i]
		}
		bound = max(bound, total/max(1, value))
		if value <= 1+1e-9 {
			break
		}
		patterns = append(patterns, best)
		var items []int
		for i, k := range best {
			for range k {
				items = append(items, sizes[i])
			}
		}
		r.patterns = append(r.patterns, items)
	}
	return int(math.Ceil(bound - 1e-6))
}

// solveDual solves max Σ demand·y s.t. pattern·y ≤ 1 for every pattern,
// y ≥ 0, with slack variables as the starting basis.
func solveDual(patterns [][]int, demand []int) ([]float64, bool) {
	m, np := len(demand), len(patterns)
	c := make([]float64, m+np)
	for i, d := range demand {
		c[i] = -float64(d)
	}
	a := mat.NewDense(np, m+np, nil)
	b := make([]float64, np)
	basic := make([]int, np)
	for r, p := range patterns {
		for i, k := range p {
			a.Set(r, i, float64(k))
		}
		a.Set(r, m+r, 1)
		b[r] = 1
		basic[r] = m + r
	}
	_, x, err := lp.Simplex(c, a, b, 1e-10, basic)
	if err != nil {
		return nil, false
	}
	return x[:m], true
}

// knapsack finds the pattern (copies of each size, at most its demand,
// fitting one GPU) of the greatest total dual value.
func knapsack(sizes, demand []int, y []float64) ([]int, float64) {
	const c = gpu.CoresPerGPU
	// Bounded knapsack by binary splitting of each size's copies.
	type part struct{ item, copies int }
	var parts []part
	for i := range sizes {
		left := min(demand[i], c/sizes[i])
		for k := 1; left > 0; k *= 2 {
			n := min(k, left)
			parts = append(parts, part{i, n})
			left -= n
		}
	}
	best := make([]float64, c+1)
	take := make([][]bool, len(parts))
	for j, pt := range parts {
		take[j] = make([]bool, c+1)
		w, v := sizes[pt.item]*pt.copies, y[pt.item]*float64(pt.copies)
		for room := c; room >= w; room-- {
			if best[room-w]+v > best[room]+1e-12 {
				best[room] = best[room-w] + v
				take[j][room] = true
			}
		}
	}
	pattern := make([]int, len(sizes))
	room := c
	for j := len(parts) - 1; j >= 0; j-- {
		if take[j][room] {
			pattern[parts[j].item] += parts[j].copies
			room -= sizes[parts[j].item] * parts[j].copies
		}
	}
	return pattern, best[c]
}
