package scheduler

import (
	"testing"

	fwk "k8s.io/kube-scheduler/framework"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

func TestFilter(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	h := newHarness(t, "", nodes, pods...)
	pod := wholeGPUPod("one", "1")
	state, st := h.preFilter(pod)
	if !st.IsSuccess() {
		t.Fatal(st)
	}
	for _, c := range []struct {
		node string
		want *fwk.Status
	}{
		{"free", nil},
		{"full", fwk.NewStatus(fwk.Unschedulable, allocator.NotEnoughWholeGPUs.Message())},
		{"bare", fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			"node has no Tessera GPU inventory (annotation tessera.dev/inventory); is tessera-agent running there?")},
		{"garbage", fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			"node's GPU inventory (annotation tessera.dev/inventory) is unreadable (see the node's InvalidGPUInventory event); its tessera-agent republishes it when it runs there")},
		{"no-slots", fwk.NewStatus(fwk.Unschedulable, reasonInsufficientSlots)},
		// The node's GPUs alone refuse it: no eviction helps, so
		// preemption passes the node by.
		{"unhealthy", fwk.NewStatus(fwk.UnschedulableAndUnresolvable, allocator.NoHealthyGPU.Message())},
	} {
		t.Run(c.node, func(t *testing.T) {
			if d := cmp.Diff(c.want, h.p.Filter(h.ctx, state, pod, h.nodeInfo(c.node))); d != "" {
				t.Errorf("Filter on %s (-want +got):\n%s", c.node, d)
			}
		})
	}
	// The cluster-wide tally PostFilter reports.
	if got := readState(state).rejected.dominant(); got == "Other" {
		t.Fatalf("no reason tallied")
	}
	// A cycle without PreFilter's state is a bug to report, not a fit.
	want := fwk.AsStatus(errNoCycleState)
	if d := cmp.Diff(want, h.p.Filter(h.ctx, framework.NewCycleState(), pod, h.nodeInfo("free"))); d != "" {
		t.Errorf("Filter without PreFilter's state (-want +got):\n%s", d)
	}
}

// TestSlotsFit: kubelet's device-plugin slots decide as the snapshot counts
// them, whether the allocatable comes from the snapshot's map or from the
// cache's read of the same object (FitNode).
func TestSlotsFit(t *testing.T) {
	node := schedtest.InventoryNode(t, schedtest.Inventory("n1", 1, 81920, false)) // 8 slots
	taken := wholeGPUPod("taken", "1")
	taken.Spec.Containers[0].Resources.Requests = v1.ResourceList{gpu.ResourceGPU: resource.MustParse("7")}
	info := schedtest.SnapshotOf(node, taken)
	for _, c := range []struct {
		name              string
		want, allocatable int64
		fits              bool
	}{
		{"one of one free, from the snapshot", 1, -1, true},
		{"two of one free, from the snapshot", 2, -1, false},
		{"one of one free, from the cache", 1, 8, true},
		{"two of one free, from the cache", 2, 8, false},
		{"none asked", 0, 0, true},
	} {
		if st := slotsFit(c.want, info, c.allocatable); st.IsSuccess() != c.fits {
			t.Errorf("%s: slotsFit = %v, want fits %v", c.name, st, c.fits)
		}
	}
}
