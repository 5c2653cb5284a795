package scheduler

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/preemption"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

func TestPostFilterNotifiesTheVictim(t *testing.T) {
	node := schedtest.InventoryNode(t, schedtest.Inventory("n1", 1, 81920, false))
	low := schedtest.GPUPod(t, "low", "n1", 0)
	lowPrio, highPrio := int32(10), int32(1000)
	low.Spec.Priority = &lowPrio
	low.Spec.PreemptionPolicy = nil
	low.ResourceVersion = "1"
	h := newHarness(t, "", []*v1.Node{node}, low)
	urgent := wholeGPUPod("urgent", "1")
	urgent.Spec.Priority = &highPrio
	state, _ := h.preFilter(urgent)
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set("n1", h.p.Filter(h.ctx, state, urgent, h.nodeInfo("n1")))
	if st := statuses.Get("n1"); st.Code() != fwk.Unschedulable {
		t.Fatalf("Filter = %v", st)
	}
	statuses.Get("n1").SetPlugin(Name)
	res, st := h.p.PostFilter(h.ctx, state, urgent, statuses)
	if !st.IsSuccess() || res == nil || res.NominatedNodeName != "n1" {
		t.Fatalf("PostFilter = %+v, %v; want the pod nominated to n1", res, st)
	}
	got, err := h.client.CoreV1().Pods("ml").Get(h.ctx, "low", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := preemption.NoticeOf(got)
	if err != nil || n == nil || n.PreemptorUID != string(urgent.UID) || n.Node != "n1" || n.Deadline.Sub(n.NoticeAt) != 30*time.Second {
		t.Fatalf("victim's notice %+v, %v", n, err)
	}
}
