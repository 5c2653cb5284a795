package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// ErrNoTimes says a pod list has no creation and deletion times to replay
// by (the multigpu openb lists have every time 0).
var ErrNoTimes = errors.New("the pod list has no creation_time and deletion_time (every pod has 0): a timeline replay needs them")

// TimelineOptions tune one replay by time.
type TimelineOptions struct {
	Policy config.Policy
	// Seed renames the nodes, as in Run: ties between equal scores go to
	// the earliest node of the seed's order.
	Seed uint64
	// Speedup divides the creation times, not the lifetimes: above 1 the
	// same pods arrive in less time and contend for the GPUs (1 when zero).
	Speedup float64
	// Samples is how many points the curves have, evenly spread over the
	// arrival window (100 when zero).
	Samples int
	// Progress, if set, is called with the events done and the total.
	Progress func(done, total int)

	// retryEverywhere tries every waiting pod on every node after each
	// departure: the reference the tests hold the fast retry to.
	retryEverywhere bool
}

// TimelineResult is one policy × seed replay by time. Allocation and
// fragmentation are taken over the arrival window, from the first pod's
// creation to the last one's: after it the cluster only drains.
type TimelineResult struct {
	Workload string
	Policy   config.Policy
	Seed     uint64
	Speedup  float64
	GPUs     int
	Pods     int
	// MeanAllocation and P5Allocation are the GPU allocation (% of
	// capacity, a fractional pod counts its gpu_milli) weighted by time:
	// its mean, and the level it stayed above 95 % of the time.
	MeanAllocation, P5Allocation float64
	// DelayP50 and DelayP99 are the queueing delays of the pods placed
	// (seconds from creation to placement), nearest rank.
	DelayP50, DelayP99 float64
	// Queued counts the pods that waited at all; NeverPlaced the ones still
	// waiting when the last pod left.
	Queued, NeverPlaced int
	// Fragmentation is the mean, over the samples, of the fragmented share
	// of the free GPU compute against the trace's target workload
	// (allocator.MeasureFragmentation), in %.
	Fragmentation float64
	// Times (seconds, speedup applied), Allocation (%) and Queue (pods
	// waiting) are the curves, one point per sample.
	Times      []float64
	Allocation []float64
	Queue      []int
}

// timed is a pod with its replay times.
type timed struct {
	pod              int // index in Trace.Pods
	arrive, lifetime float64
}

// running is a placed pod and when it leaves.
type running struct {
	leave float64
	seq   int // placement order, for a stable order of equal times
	pod   int
	node  int
	p     allocator.Placement
}

type departures []*running

func (d departures) Len() int { return len(d) }
func (d departures) Less(i, j int) bool {
	if d[i].leave != d[j].leave {
		return d[i].leave < d[j].leave
	}
	return d[i].seq < d[j].seq
}
func (d departures) Swap(i, j int) { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)   { *d = append(*d, x.(*running)) }
func (d *departures) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// Timeline replays the pod list by time: each pod arrives at its
// creation_time (divided by Speedup) and stays its lifetime
// (deletion_time − creation_time) from when it is placed. A pod that fits
// nowhere waits in a queue, in arrival order, and is tried again whenever
// a pod leaves, as kube-scheduler retries pods on a deletion; a departure
// frees one node, so only that node is tried. Departures at a time come
// before arrivals at it.
func (t *Trace) Timeline(cfg config.AllocatorConfig, o TimelineOptions) (*TimelineResult, error) {
	if o.Speedup == 0 {
		o.Speedup = 1
	}
	if !(o.Speedup > 0) || math.IsInf(o.Speedup, 0) {
		return nil, fmt.Errorf("speedup %v: must be a positive number", o.Speedup)
	}
	if o.Samples <= 0 {
		o.Samples = 100
	}
	arrivals, err := t.timed(o.Speedup)
	if err != nil {
		return nil, err
	}
	a, nodes, _, err := t.cluster(cfg, o.Policy, o.Seed)
	if err != nil {
		return nil, err
	}
	cache := allocator.NewCache(a, nodes)
	res := &TimelineResult{Workload: t.Name, Policy: o.Policy, Seed: o.Seed, Speedup: o.Speedup, GPUs: t.gpus, Pods: len(arrivals)}
	capacity := float64(t.gpus) * gpu.CoresPerGPU

	start, end := arrivals[0].arrive, arrivals[len(arrivals)-1].arrive
	sampleAt := func(k int) float64 {
		if o.Samples == 1 || end == start {
			return start
		}
		return start + (end-start)*float64(k)/float64(o.Samples-1)
	}
	var (
		allocated int64 // GPU cores allocated now
		queue     []timed
		leaving   departures
		seq       int
		delays    []float64
		segments  []segment // allocation held over time, in the window
		lastT     = start
		nextS     int
		fragSum   float64
		done      int
	)
	total := 2 * len(arrivals)
	one := make([]*allocator.Node, 1)
	var p allocator.Placement
	place := func(pi, node int, at float64, arrived float64, lifetime float64) {
		r := t.shapes[t.shapeOf[pi]]
		nodes[node].Apply(r, &p)
		for _, g := range p.Grants {
			allocated += int64(g.Cores)
		}
		run := &running{leave: at + lifetime, seq: seq, pod: pi, node: node}
		run.p.Grants = append(run.p.Grants, p.Grants...)
		seq++
		heap.Push(&leaving, run)
		delays = append(delays, at-arrived)
	}
	// advance accounts the allocation held from lastT to now (within the
	// window) and takes the samples due before now.
	advance := func(now float64) {
		for nextS < o.Samples && sampleAt(nextS) < now {
			res.Times = append(res.Times, sampleAt(nextS))
			res.Allocation = append(res.Allocation, 100*float64(allocated)/capacity)
			res.Queue = append(res.Queue, len(queue))
			fragSum += 100 * allocator.MeasureFragmentation(nodes, t.workload, replayOversubscription).Ratio()
			nextS++
		}
		from, to := max(lastT, start), min(now, end)
		if to > from {
			segments = append(segments, segment{alloc: 100 * float64(allocated) / capacity, length: to - from})
		}
		lastT = max(lastT, now)
	}
	next := 0
	for next < len(arrivals) || leaving.Len() > 0 {
		if leaving.Len() > 0 && (next == len(arrivals) || leaving[0].leave <= arrivals[next].arrive) {
			run := heap.Pop(&leaving).(*running)
			advance(run.leave)
			r := t.shapes[t.shapeOf[run.pod]]
			nodes[run.node].Release(r, &run.p)
			for _, g := range run.p.Grants {
				allocated -= int64(g.Cores)
			}
			done++
			// Only the freed node can take a waiting pod now; a shape that
			// does not fit there is not tried again in this pass (the node
			// only fills).
			one[0] = nodes[run.node]
			var refused map[int]bool
			if len(queue) > 0 {
				refused = map[int]bool{}
			}
			kept := queue[:0]
			for _, w := range queue {
				shape := t.shapeOf[w.pod]
				if o.retryEverywhere {
					if best := cache.Choose(t.shapes[shape], shape, &p); best >= 0 {
						place(w.pod, best, run.leave, w.arrive, w.lifetime)
						continue
					}
				} else if !refused[shape] && a.Choose(one, t.shapes[shape], &p) == 0 {
					place(w.pod, run.node, run.leave, w.arrive, w.lifetime)
					continue
				}
				refused[shape] = true
				kept = append(kept, w)
			}
			queue = kept
		} else {
			w := arrivals[next]
			next++
			advance(w.arrive)
			shape := t.shapeOf[w.pod]
			if best := cache.Choose(t.shapes[shape], shape, &p); best >= 0 {
				place(w.pod, best, w.arrive, w.arrive, w.lifetime)
			} else {
				queue = append(queue, w)
				res.Queued++
			}
			done++
		}
		if o.Progress != nil && (done%512 == 0 || done == total) {
			o.Progress(done, total)
		}
	}
	if o.Progress != nil && done < total {
		o.Progress(total, total) // pods never placed never left
	}
	advance(math.Inf(1))
	res.NeverPlaced = len(queue)
	res.MeanAllocation, res.P5Allocation = timeWeighted(segments, end-start)
	sort.Float64s(delays)
	res.DelayP50, res.DelayP99 = nearestRank(delays, 0.50), nearestRank(delays, 0.99)
	if len(res.Times) > 0 {
		res.Fragmentation = fragSum / float64(len(res.Times))
	}
	return res, nil
}

// timed is the pods with their replay times, in arrival order (the list's
// order among equal times).
func (t *Trace) timed(speedup float64) ([]timed, error) {
	out := make([]timed, len(t.Pods))
	any := false
	for i, p := range t.Pods {
		if p.Deleted < p.Created {
			return nil, fmt.Errorf("%w: pod %s leaves (deletion_time %d) before it arrives (creation_time %d)", ErrTrace, p.Name, p.Deleted, p.Created)
		}
		any = any || p.Created != 0 || p.Deleted != 0
		out[i] = timed{pod: i, arrive: float64(p.Created) / speedup, lifetime: float64(p.Deleted - p.Created)}
	}
	if !any {
		return nil, ErrNoTimes
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].arrive < out[j].arrive })
	return out, nil
}

// segment is an allocation level held for a length of time.
type segment struct{ alloc, length float64 }

// timeWeighted is the time-weighted mean of the segments over span, and the
// level the allocation stayed at or above 95 % of the time.
func timeWeighted(segments []segment, span float64) (mean, p5 float64) {
	if span <= 0 || len(segments) == 0 {
		if len(segments) > 0 {
			return segments[len(segments)-1].alloc, segments[len(segments)-1].alloc
		}
		return 0, 0
	}
	var sum float64
	for _, s := range segments {
		sum += s.alloc * s.length
	}
	sorted := append([]segment(nil), segments...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].alloc < sorted[j].alloc })
	var acc float64
	p5 = sorted[len(sorted)-1].alloc
	for _, s := range sorted {
		acc += s.length
		if acc >= 0.05*span {
			p5 = s.alloc
			break
		}
	}
	return sum / span, p5
}

// nearestRank is the q-quantile of sorted values, nearest rank; 0 for none.
func nearestRank(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(k, len(sorted)-1))]
}
