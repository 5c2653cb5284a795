package agent

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/agent/nodepods"
)

// TestAssignmentChangesAreReported: each change of a bound pod's
// assignment that nodepods undid (issue 15) is reported as a Warning event
// on the pod and counted in tessera_agent_assignment_changes_total.
func TestAssignmentChangesAreReported(t *testing.T) {
	first := `{"v":"v1","node":"n1","containers":[{"name":"main","mode":"exclusive","gpus":[{"uuid":"GPU-0","index":0,"memoryMiB":81920,"cores":1000}]}]}`
	moved := `{"v":"v1","node":"n1","containers":[{"name":"main","mode":"exclusive","gpus":[{"uuid":"GPU-5","index":5,"memoryMiB":81920,"cores":1000}]}]}`
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "train", UID: "u1"}, Spec: v1.PodSpec{NodeName: "n1"}}
	client := fake.NewClientset(pod)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := make(chan nodepods.AssignmentChange, 1)
	a := withRecorder(t, &Agent{m: newAgentMetrics(), opts: Options{Node: "n1", Client: client, AssignmentChanges: changes}})
	before := testutil.ToFloat64(a.m.assignmentChanges.WithLabelValues("n1"))
	go a.reportAssignmentChanges(ctx)
	changes <- nodepods.AssignmentChange{Pod: pod, First: first, Now: moved}
	isWarning := func(evs []v1.Event) bool {
		return eventWith("GPUAssignmentChanged", "train", "was changed after the pod was bound")(evs) && evs[0].Type == v1.EventTypeWarning
	}
	if !isWarning(waitEvents(t, client, "lab", isWarning)) {
		t.Fatal("no GPUAssignmentChanged warning on the pod")
	}
	if got := testutil.ToFloat64(a.m.assignmentChanges.WithLabelValues("n1")) - before; got != 1 {
		t.Errorf("tessera_agent_assignment_changes_total rose by %v, want 1", got)
	}
}
