package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	fwk "k8s.io/kube-scheduler/framework"
)

func TestReserveAndUnreserve(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	h := newHarness(t, "", nodes, pods...)
	first, second := wholeGPUPod("first", "1"), wholeGPUPod("second", "1")
	s1, _ := h.preFilter(first)
	s2, _ := h.preFilter(second)
	if st := h.p.Reserve(h.ctx, s1, first, "free"); !st.IsSuccess() {
		t.Fatalf("Reserve = %v", st)
	}
	if a := h.p.cache.Assignment(first.UID); a == nil || a.Node != "free" || readState(s1).assignment != a {
		t.Fatalf("booked %+v, want the assignment on node free in the cycle state", a)
	}
	if d := cmp.Diff(fwk.NewStatus(fwk.Unschedulable, "wants 1 whole GPU, 0 are free"), h.p.Reserve(h.ctx, s2, second, "free")); d != "" {
		t.Fatalf("second Reserve on the same GPU (-want +got):\n%s", d)
	}
	if d := cmp.Diff(fwk.NewStatus(fwk.Unschedulable, "node bare lost its GPU inventory"), h.p.Reserve(h.ctx, s2, second, "bare")); d != "" {
		t.Fatalf("Reserve on a node without inventory (-want +got):\n%s", d)
	}
	freed := h.p.cache.RoomChanges()
	h.p.Unreserve(h.ctx, s1, first, "free")
	if h.p.cache.Assignment(first.UID) != nil || readState(s1).assignment != nil || h.p.cache.RoomChanges() == freed {
		t.Fatal("Unreserve kept the booking")
	}
	if st := h.p.Reserve(h.ctx, s2, second, "free"); !st.IsSuccess() {
		t.Fatalf("Reserve after the release = %v", st)
	}
}
