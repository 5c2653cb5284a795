package scheduler

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

func TestBind(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	refuses := schedtest.InventoryNode(t, schedtest.Inventory("refuses-bindings", 1, 81920, false))
	h := newHarness(t, "", append(nodes, refuses), pods...)
	pod := wholeGPUPod("one", "1")
	state, _ := h.preFilter(pod)
	if st := h.p.Reserve(h.ctx, state, pod, "free"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.p.Bind(h.ctx, state, pod, "free"); !st.IsSuccess() {
		t.Fatalf("Bind = %v", st)
	}
	h.mu.Lock()
	if len(h.bindings) != 1 {
		t.Fatalf("%d bindings", len(h.bindings))
	}
	b := h.bindings[0]
	h.mu.Unlock()
	a, err := gpu.DecodeAssignment(b.Annotations[gpu.AnnotationAssignment])
	if err != nil || b.Target.Name != "free" || b.Name != "one" || a.Node != "free" || a.Containers[0].GPUs[0].UUID != "GPU-free-0" {
		t.Fatalf("binding %+v (assignment %+v, %v): want pod one to node free with its GPU", b, a, err)
	}

	other := wholeGPUPod("other", "1")
	s2, _ := h.preFilter(other)
	if st := h.p.Reserve(h.ctx, s2, other, "refuses-bindings"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.p.Bind(h.ctx, s2, other, "refuses-bindings"); st.IsSuccess() || !strings.Contains(st.Message(), "bind pod ml/other to refuses-bindings") {
		t.Fatalf("Bind against a failing API server = %v", st)
	}
	if st := h.p.Bind(h.ctx, framework.NewCycleState(), &v1.Pod{}, "free"); st.Code() != fwk.Skip {
		t.Fatalf("Bind of a pod without GPUs = %v, want Skip", st)
	}
}
