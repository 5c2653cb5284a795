package sim

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

func timelineTrace(t *testing.T, nodes []NodeSpec, pods []PodSpec) *Trace {
	t.Helper()
	tr, err := NewTrace("t", nodes, pods, config.Default().Allocator.WorkloadCoverage)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestTimelineQueuesAndRetries: on one GPU, a whole-GPU pod that arrives
// while another holds it waits, and is placed when that one leaves; two
// halves share the GPU at once; a pod that fits nowhere is never placed.
func TestTimelineQueuesAndRetries(t *testing.T) {
	node := []NodeSpec{{Name: "n0", CPUMilli: 64000, MemoryMiB: 256 << 10, GPUs: 1, Model: "A100"}}
	tests := []struct {
		name string
		pods []PodSpec
		want TimelineResult // the fields compared below
	}{
		{"a pod waits for the GPU", []PodSpec{
			{Name: "a", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000, Created: 0, Deleted: 100},
			{Name: "b", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000, Created: 10, Deleted: 60},
		}, TimelineResult{MeanAllocation: 100, P5Allocation: 100, DelayP50: 0, DelayP99: 90, Queued: 1}},
		{"two halves share it", []PodSpec{
			{Name: "a", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500, Created: 0, Deleted: 100},
			{Name: "b", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500, Created: 50, Deleted: 60},
			{Name: "c", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500, Created: 100, Deleted: 200},
		}, TimelineResult{MeanAllocation: 55, P5Allocation: 50}},
		{"too big for the cluster", []PodSpec{
			{Name: "a", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 250, Created: 0, Deleted: 100},
			{Name: "big", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 2, GPUMilli: 1000, Created: 20, Deleted: 30},
		}, TimelineResult{MeanAllocation: 25, P5Allocation: 25, Queued: 1, NeverPlaced: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := timelineTrace(t, node, tt.pods)
			got, err := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: config.PolicyTessera, Seed: 42, Samples: 5})
			if err != nil {
				t.Fatal(err)
			}
			g := TimelineResult{MeanAllocation: got.MeanAllocation, P5Allocation: got.P5Allocation, DelayP50: got.DelayP50, DelayP99: got.DelayP99,
				Queued: got.Queued, NeverPlaced: got.NeverPlaced}
			if !reflect.DeepEqual(g, tt.want) {
				t.Errorf("got %+v, want %+v", g, tt.want)
			}
			if len(got.Times) != 5 || len(got.Allocation) != 5 || len(got.Queue) != 5 {
				t.Errorf("curves of %d, %d and %d points, want 5", len(got.Times), len(got.Allocation), len(got.Queue))
			}
		})
	}
}

// TestTimelineRetriesOnlyTheFreedNode: trying only the node a departure
// freed (and each shape once per pass) places exactly what trying every
// waiting pod on every node does, on a contended synthetic workload.
func TestTimelineRetriesOnlyTheFreedNode(t *testing.T) {
	nodes, pods := Synthetic(SyntheticOptions{Nodes: 16, Pods: 600, Seed: 3})
	tr := timelineTrace(t, nodes, pods)
	for _, pol := range []config.Policy{config.PolicyFGD, config.PolicyTessera, config.PolicyBinpack} {
		fast, err := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: pol, Seed: 42, Speedup: 4})
		if err != nil {
			t.Fatal(err)
		}
		slow, err := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: pol, Seed: 42, Speedup: 4, retryEverywhere: true})
		if err != nil {
			t.Fatal(err)
		}
		if fast.Queued == 0 {
			t.Fatalf("%s: no pod waited; the test needs contention", pol)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Errorf("%s: retrying the freed node only gives\n%+v\nretrying everywhere\n%+v", pol, summary(fast), summary(slow))
		}
	}
}

func summary(r *TimelineResult) TimelineResult {
	c := *r
	c.Times, c.Allocation, c.Queue = nil, nil, nil
	return c
}

// TestTimelineOnTheBuiltInWorkload: every policy replays the synthetic
// workload by time with numbers in range, the same twice.
func TestTimelineOnTheBuiltInWorkload(t *testing.T) {
	nodes, pods := Synthetic(SyntheticOptions{Nodes: 32, Pods: 800, Seed: 1})
	tr := timelineTrace(t, nodes, pods)
	for _, pol := range config.Policies {
		r, err := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: pol, Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		again, _ := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: pol, Seed: 42})
		if !reflect.DeepEqual(r, again) {
			t.Errorf("%s: two replays differ", pol)
		}
		if !(r.MeanAllocation > 0 && r.MeanAllocation <= 100 && r.P5Allocation <= r.MeanAllocation && r.DelayP50 <= r.DelayP99 &&
			r.NeverPlaced <= r.Queued && r.Fragmentation >= 0 && r.Fragmentation <= 100 && r.Pods == 800) {
			t.Errorf("%s: out of range: %+v", pol, summary(r))
		}
		for k, a := range r.Allocation {
			if a < 0 || a > 100 || math.IsNaN(a) || r.Queue[k] < 0 {
				t.Errorf("%s: sample %d: allocation %v, queue %d", pol, k, a, r.Queue[k])
			}
		}
	}
}

// TestTimelineNeedsTimes: a list without times (the multigpu openb lists)
// is refused with why, as is a bad speedup.
func TestTimelineNeedsTimes(t *testing.T) {
	node := []NodeSpec{{Name: "n0", CPUMilli: 64000, MemoryMiB: 256 << 10, GPUs: 1, Model: "A100"}}
	tr := timelineTrace(t, node, []PodSpec{{Name: "a", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 500}})
	if _, err := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: config.PolicyFGD}); !errors.Is(err, ErrNoTimes) {
		t.Errorf("no times: %v, want ErrNoTimes", err)
	}
	if _, err := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: config.PolicyFGD, Speedup: -2}); err == nil || !strings.Contains(err.Error(), "speedup -2") {
		t.Errorf("speedup -2: %v", err)
	}
}

// TestTimelineOnOpenbDefault: the openb default list replays by time (as
// fast as the trace's arrivals, and 100 times as fast), every pod placed
// or counted as waiting.
func TestTimelineOnOpenbDefault(t *testing.T) {
	tr := openbTrace(t, "default")
	for _, speedup := range []float64{1, 100} {
		r, err := tr.Timeline(config.Default().Allocator, TimelineOptions{Policy: config.PolicyTessera, Seed: 42, Speedup: speedup})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("speedup %g: allocation mean %.2f%% p5 %.2f%%, delay p50 %.0fs p99 %.0fs, queued %d, never placed %d, fragmentation %.1f%%",
			speedup, r.MeanAllocation, r.P5Allocation, r.DelayP50, r.DelayP99, r.Queued, r.NeverPlaced, r.Fragmentation)
		if r.Pods != len(tr.Pods) || !(r.MeanAllocation > 0 && r.MeanAllocation <= 100) || r.NeverPlaced > r.Queued {
			t.Errorf("speedup %g: %+v", speedup, summary(r))
		}
	}
}
