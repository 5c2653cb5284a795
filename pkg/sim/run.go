package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Trace is a cluster and a pod list, ready to replay.
type Trace struct {
	// Name labels the workload in the CSV output (for example "default").
	Name  string
	Nodes []NodeSpec
	Pods  []PodSpec

	shapes   []*allocator.Request // distinct pod shapes
	shapeOf  []int                // pod index → shape id
	workload *allocator.Workload
	coverage float64
	gpus     int
}

// NewTrace checks a trace and prepares what every run shares: the distinct
// request shapes and the target workload, taken once from the pod list as
// given (before tuning), as the FGD paper does: the most common shapes (CPU
// milli, GPU milli, GPU count, GPU models) that together cover `coverage` of
// the pods, CPU-only pods included.
func NewTrace(name string, nodes []NodeSpec, pods []PodSpec, coverage float64) (*Trace, error) {
	t := &Trace{Name: name, Nodes: nodes, Pods: pods, shapeOf: make([]int, len(pods)), coverage: coverage}
	for _, n := range nodes {
		t.gpus += n.GPUs
	}
	if t.gpus == 0 {
		return nil, fmt.Errorf("%w: the cluster has no GPU", ErrTrace)
	}
	ids := map[string]int{}
	typical := map[string]*allocator.ShapeCount{}
	var order []string
	for i, p := range pods {
		r := p.Request()
		if err := r.Check(); err != nil {
			return nil, fmt.Errorf("pod %s: %w", p.Name, err)
		}
		k := r.Key()
		id, ok := ids[k]
		if !ok {
			id = len(t.shapes)
			ids[k] = id
			t.shapes = append(t.shapes, r)
		}
		t.shapeOf[i] = id
		// The paper's shapes leave out pod memory.
		shape := *r
		shape.MemoryMiB = 0
		sk := shape.Key()
		if sc := typical[sk]; sc != nil {
			sc.Count++
		} else {
			typical[sk] = &allocator.ShapeCount{Request: &shape, Count: 1}
			order = append(order, sk)
		}
	}
	counts := make([]allocator.ShapeCount, 0, len(order))
	for _, k := range order {
		counts = append(counts, *typical[k])
	}
	w, err := allocator.NewWorkload(counts, coverage)
	if err != nil {
		return nil, err
	}
	t.workload = w
	return t, nil
}

// GPUs is the number of GPUs in the cluster.
func (t *Trace) GPUs() int { return t.gpus }

// Workload is the target workload the fragmentation policies score against.
func (t *Trace) Workload() *allocator.Workload { return t.workload }

// Result is one policy × seed replay.
type Result struct {
	Workload string
	Policy   config.Policy
	Seed     uint64
	Tune     float64
	GPUs     int
	// Curve[k] is the mean GPU allocation (% of capacity) over the arrivals at
	// which arrived GPU demand rounded to k % of capacity; NaN if no arrival did.
	Curve []float64
	// Final is the allocation after the last arrival, in %.
	Final float64
	// Pods and Failed count arrivals and the ones that fit nowhere.
	Pods, Failed int
	// SharingFailedBy100 counts the sharing pods (one GPU, less than all of
	// it) that fit nowhere before arrived demand passed 100 % of capacity:
	// where it is 0, the run is bound by the seed's Ceiling.
	SharingFailedBy100 int
	// Placed[i] is the position in the trace's node list of the node the i-th
	// arrival landed on, or -1; kept only when asked (tests compare it).
	Placed []int
	// Fragmentation is Tessera's one figure (allocator.MeasureFragmentation)
	// after the last arrival, against the pods that arrived, placed or not:
	// the pods present then.
	Fragmentation allocator.Fragmentation
}

// At100 is the allocation when arrived demand reached 100 % of capacity.
func (r *Result) At100() float64 {
	if len(r.Curve) > 100 {
		return r.Curve[100]
	}
	return math.NaN()
}

// RunOptions tune one replay.
type RunOptions struct {
	Policy config.Policy
	Seed   uint64
	Tune   float64
	// Plain scores every node for every pod without the cache (for tests that
	// prove the cache changes nothing).
	Plain bool
	// KeepPlacements fills Result.Placed.
	KeepPlacements bool
	// Progress, if set, is called with the arrivals done and the total.
	Progress func(done, total int)
}

// Arrivals returns the pod sequence of a seed: every pod of the list, plus pods
// drawn at random with replacement until their total GPU demand reaches
// tune × capacity; or, when the list alone is above that, pods removed at
// random until it is not. Then shuffled.
func (t *Trace) Arrivals(seed uint64, tune float64) []int {
	rng := rand.New(rand.NewPCG(seed, 0x7e55e7a))
	target := int64(math.Round(tune * float64(t.gpus) * gpu.CoresPerGPU))
	seq := make([]int, len(t.Pods))
	var total int64
	for i, p := range t.Pods {
		seq[i] = i
		total += p.Demand()
	}
	if total < target {
		for total < target {
			i := rng.IntN(len(t.Pods))
			seq = append(seq, i)
			total += t.Pods[i].Demand()
		}
	} else {
		for total > target {
			k := rng.IntN(len(seq))
			total -= t.Pods[seq[k]].Demand()
			seq[k] = seq[len(seq)-1]
			seq = seq[:len(seq)-1]
		}
	}
	rng.Shuffle(len(seq), func(i, j int) { seq[i], seq[j] = seq[j], seq[i] })
	return seq
}

// nodeOrder is the seeded renaming of nodes: ties between equal scores go to
// the earliest node of this order, as the published runs break them by the
// smallest node name after a seeded renaming.
func (t *Trace) nodeOrder(seed uint64) []int {
	rng := rand.New(rand.NewPCG(seed, 0x40de))
	return rng.Perm(len(t.Nodes))
}

// replayOversubscription is the GPU memory oversubscription of every replay:
// none, as in the paper, where memory follows gpu_milli.
const replayOversubscription = 1.0

// cluster is an empty cluster for one replay: the allocator of policy,
// with memory following gpu_milli and no oversubscription (comparability
// with the paper), and the nodes in the seed's order (order[i] is node i's
// position in the trace's list).
func (t *Trace) cluster(cfg config.AllocatorConfig, policy config.Policy, seed uint64) (*allocator.Allocator, []*allocator.Node, []int, error) {
	cfg.Policy = policy
	cfg.MemoryOversubscription = replayOversubscription
	a, err := allocator.New(&cfg, t.workload)
	if err != nil {
		return nil, nil, nil, err
	}
	order := t.nodeOrder(seed)
	nodes := make([]*allocator.Node, len(order))
	for i, k := range order {
		if nodes[i], err = allocator.NewNode(t.Nodes[k].Inventory()); err != nil {
			return nil, nil, nil, err
		}
	}
	return a, nodes, order, nil
}

// Run replays the trace once.
func (t *Trace) Run(cfg config.AllocatorConfig, o RunOptions) (*Result, error) {
	a, nodes, order, err := t.cluster(cfg, o.Policy, o.Seed)
	if err != nil {
		return nil, err
	}
	seq := t.Arrivals(o.Seed, o.Tune)
	res := &Result{Workload: t.Name, Policy: o.Policy, Seed: o.Seed, Tune: o.Tune, GPUs: t.gpus, Pods: len(seq)}
	cols := int(math.Round(o.Tune*100)) + 1
	sums := make([]float64, cols)
	counts := make([]int, cols)
	jumped := make([]float64, cols)
	for k := range jumped {
		jumped[k] = math.NaN()
	}
	lastK, prevAlloc := 0, 0.0
	if o.KeepPlacements {
		res.Placed = make([]int, len(seq))
	}
	var cache *allocator.Cache
	if !o.Plain {
		cache = allocator.NewCache(a, nodes)
	}
	capacity := float64(t.gpus) * gpu.CoresPerGPU
	var arrived, allocated int64
	var p allocator.Placement
	for step, pi := range seq {
		shape := t.shapeOf[pi]
		r := t.shapes[shape]
		var best int
		if cache != nil {
			best = cache.Choose(r, shape, &p)
		} else {
			best = a.Choose(nodes, r, &p)
		}
		arrived += t.Pods[pi].Demand()
		if best >= 0 {
			nodes[best].Apply(r, &p)
			for _, g := range p.Grants {
				allocated += int64(g.Cores)
			}
		} else {
			res.Failed++
			if pod := t.Pods[pi]; pod.NumGPU == 1 && pod.GPUMilli < gpu.CoresPerGPU && math.Round(100*float64(arrived)/capacity) <= 100 {
				res.SharingFailedBy100++
			}
		}
		if res.Placed != nil {
			res.Placed[step] = -1
			if best >= 0 {
				res.Placed[step] = order[best]
			}
		}
		k := int(math.Round(100 * float64(arrived) / capacity))
		// A large pod can jump over columns: the allocation in force at those
		// levels is the one before it arrived.
		for j := lastK + 1; j < k && j < cols; j++ {
			jumped[j] = prevAlloc
		}
		lastK = max(lastK, k)
		alloc := 100 * float64(allocated) / capacity
		prevAlloc = alloc
		if k < cols {
			sums[k] += alloc
			counts[k]++
		}
		if o.Progress != nil && (step%256 == 0 || step == len(seq)-1) {
			o.Progress(step+1, len(seq))
		}
	}
	res.Curve = make([]float64, cols)
	for k := range cols {
		switch {
		case counts[k] > 0:
			res.Curve[k] = sums[k] / float64(counts[k])
		case !math.IsNaN(jumped[k]):
			res.Curve[k] = jumped[k]
		default:
			res.Curve[k] = math.NaN()
		}
	}
	res.Final = 100 * float64(allocated) / capacity
	res.Fragmentation = t.fragmentation(nodes, seq, replayOversubscription)
	return res, nil
}

// fragmentation measures the nodes against the arrivals' shapes, each
// counted once per arrival.
func (t *Trace) fragmentation(nodes []*allocator.Node, seq []int, oversub float64) allocator.Fragmentation {
	perShape := make([]float64, len(t.shapes))
	for _, pi := range seq {
		perShape[t.shapeOf[pi]]++
	}
	var counts []allocator.ShapeCount
	for shape, n := range perShape {
		if n > 0 {
			counts = append(counts, allocator.ShapeCount{Request: t.shapes[shape], Count: n})
		}
	}
	w, err := allocator.NewWorkload(counts, t.coverage)
	if err != nil {
		w = nil // no arrivals: nothing is fragmented
	}
	return allocator.MeasureFragmentation(nodes, w, oversub)
}

// ParseSeeds reads "42-51", "42,43,50" or a mix of both.
func ParseSeeds(s string) ([]uint64, error) {
	var seeds []uint64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		var a, b uint64
		if _, err := fmt.Sscanf(lo, "%d", &a); err != nil || strings.TrimSpace(lo) != fmt.Sprint(a) {
			return nil, fmt.Errorf("--seeds %q: %q is not a seed", s, part)
		}
		b = a
		if isRange {
			if _, err := fmt.Sscanf(hi, "%d", &b); err != nil || strings.TrimSpace(hi) != fmt.Sprint(b) {
				return nil, fmt.Errorf("--seeds %q: %q is not a range low-high", s, part)
			}
			if b < a {
				return nil, fmt.Errorf("--seeds %q: range %q runs backwards; write it low-high, as %d-%d", s, part, b, a)
			}
		}
		if b-a > 10000 {
			return nil, fmt.Errorf("--seeds %q: more than 10000 seeds", s)
		}
		for v := a; v <= b; v++ {
			seeds = append(seeds, v)
		}
	}
	if len(seeds) == 0 {
		return nil, fmt.Errorf("--seeds %q: no seed", s)
	}
	return seeds, nil
}
