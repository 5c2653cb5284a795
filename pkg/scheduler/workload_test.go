package scheduler

import (
	"testing"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

func TestWorkloadTrackerFollowsTheMix(t *testing.T) {
	base := schedtest.NewAllocator(t)
	tr := newWorkloadTracker(base, 0.95)
	if tr.Current() != base {
		t.Fatal("a fresh tracker should score with the base allocator")
	}
	small := schedtest.SliceOf(gpu.ModeAuto, 8192, 10)
	tr.Observe(small)
	first := tr.Current()
	if first == base {
		t.Fatal("the first observation should build a workload")
	}
	for range refreshEvery {
		tr.Observe(small)
	}
	if tr.Current() == first {
		t.Fatal("refreshEvery observations should rebuild the workload")
	}
	for range workloadWindow * 2 {
		tr.Observe(small)
	}
	if len(tr.ring) != workloadWindow || tr.counts[small.Key()].Count != workloadWindow {
		t.Fatalf("window holds %d requests, count %v", len(tr.ring), tr.counts[small.Key()].Count)
	}
}
