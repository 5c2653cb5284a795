package nodepods

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestFirstAssignmentCounts: a bound pod's assignment patched after binding
// (issue 15: the scheduler's booking moved while the pod kept its GPU) is
// undone in what the agent reads, and reported once per change.
func TestFirstAssignmentCounts(t *testing.T) {
	first := `{"v":"v1","node":"n1","containers":[{"name":"main","mode":"exclusive","gpus":[{"uuid":"GPU-0","index":0,"memoryMiB":81920,"cores":1000}]}]}`
	moved := `{"v":"v1","node":"n1","containers":[{"name":"main","mode":"exclusive","gpus":[{"uuid":"GPU-5","index":5,"memoryMiB":81920,"cores":1000}]}]}`
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "train", UID: "u1", Annotations: map[string]string{gpu.AnnotationAssignment: first}},
		Spec: v1.PodSpec{NodeName: "n1"}}
	client := fake.NewClientset(pod)
	np := Watch(client, "n1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	np.Factory.Start(ctx.Done())
	np.Factory.WaitForCacheSync(ctx.Done())

	assignmentOf := func() string {
		if p := np.Get("lab", "train"); p != nil {
			return p.Annotations[gpu.AnnotationAssignment]
		}
		return "(no pod)"
	}
	if got := assignmentOf(); got != first {
		t.Fatalf("before: %s", got)
	}
	for _, tc := range []struct {
		name string
		edit func(*v1.Pod)
		now  string
	}{
		{"moved to another GPU", func(p *v1.Pod) { p.Annotations[gpu.AnnotationAssignment] = moved }, moved},
		{"removed", func(p *v1.Pod) { delete(p.Annotations, gpu.AnnotationAssignment) }, ""},
	} {
		p, err := client.CoreV1().Pods("lab").Get(ctx, "train", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tc.edit(p)
		p.Labels = map[string]string{"step": tc.name[:5]}
		if _, err := client.CoreV1().Pods("lab").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case ch := <-np.Changes:
			if ch.First != first || ch.Now != tc.now || ch.Pod.Name != "train" {
				t.Errorf("%s: reported %+v", tc.name, ch)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no change reported", tc.name)
		}
		err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			p := np.Get("lab", "train")
			return p != nil && p.Labels["step"] == tc.name[:5], nil
		})
		if err != nil {
			t.Fatalf("%s: the informer never saw the update", tc.name)
		}
		if got := assignmentOf(); got != first {
			t.Errorf("%s: the agent reads %s, want the first assignment", tc.name, got)
		}
	}
}
