package refusal

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// events keeps the events a Tracker of node records, as "Kind/name
// reason: note".
type events struct {
	node string
	mu   sync.Mutex
	all  []string
}

func (e *events) nodeEvent(_ context.Context, eventType, reason, note string) {
	e.record("Node/"+e.node, eventType, reason, note)
}

func (e *events) podEvent(_ context.Context, _, name string, _ types.UID, eventType, reason, note string) {
	e.record("Pod/"+name, eventType, reason, note)
}

func (e *events) record(about, eventType, reason, note string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if eventType != v1.EventTypeWarning {
		note = "(not a warning) " + note
	}
	e.all = append(e.all, about+" "+reason+": "+note)
}

// with is the events that start with prefix and contain part.
func (e *events) with(prefix, part string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, s := range e.all {
		if strings.HasPrefix(s, prefix) && strings.Contains(s, part) {
			out = append(out, s)
		}
	}
	return out
}

func held(t *Tracker, node string) float64 { return testutil.ToFloat64(t.held.WithLabelValues(node)) }

// TestRefusedPodsAreDeletedAfterTheGrace: a pod refused its GPUs (bound by
// another scheduler, or before the admission policies) holds its slots
// only for the grace; then the agent deletes it, that pod and not a new one
// of the same name, and says so on the pod and the node (issue 38: slot
// hoarding until someone deletes it).
func TestRefusedPodsAreDeletedAfterTheGrace(t *testing.T) {
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	hoarder := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "hoarder", UID: "h1"}, Spec: v1.PodSpec{NodeName: "n8"}}
	late := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "late", UID: "l1"}, Spec: v1.PodSpec{NodeName: "n8"}}
	client := fake.NewClientset(hoarder, late)
	// The API server's UID precondition, which the fake lacks.
	client.PrependReactor("delete", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		del := action.(k8stesting.DeleteAction)
		pre := del.GetDeleteOptions().Preconditions
		if pre == nil || pre.UID == nil {
			return false, nil, nil
		}
		obj, err := client.Tracker().Get(action.GetResource(), del.GetNamespace(), del.GetName())
		if err == nil && obj.(*v1.Pod).UID != *pre.UID {
			return true, nil, apierrors.NewConflict(action.GetResource().GroupResource(), del.GetName(), errors.New("UID precondition failed"))
		}
		return false, nil, nil
	})
	ev := &events{node: "n8"}
	// The informer's list lags: it still has late's first pod at the end.
	tr := New(Config{Node: "n8", Client: client, Grace: time.Minute, Now: func() time.Time { return now }, NodeEvent: ev.nodeEvent, PodEvent: ev.podEvent,
		NodePods: func() []*v1.Pod { return []*v1.Pod{hoarder, late} }})
	refusal := errors.New("pod lab/hoarder names spec.schedulerName \"default-scheduler\"")
	tr.PreStarted(hoarder, "main", 31, refusal)
	now = now.Add(30 * time.Second)
	tr.PreStarted(late, "main", 1, refusal)
	ctx := context.Background()
	tr.Prune(ctx)
	if _, err := client.CoreV1().Pods("lab").Get(ctx, "hoarder", metav1.GetOptions{}); err != nil {
		t.Fatalf("hoarder deleted within its grace: %v", err)
	}
	now = now.Add(30 * time.Second) // the hoarder's minute is up, not late's
	tr.Prune(ctx)
	if _, err := client.CoreV1().Pods("lab").Get(ctx, "hoarder", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("hoarder after its grace: %v, want deleted", err)
	}
	if _, err := client.CoreV1().Pods("lab").Get(ctx, "late", metav1.GetOptions{}); err != nil {
		t.Fatalf("late deleted before its grace: %v", err)
	}
	if got := held(tr, "n8"); got != 1 {
		t.Errorf("tessera_agent_refused_slots = %v after the hoarder left, want 1", got)
	}
	// A new pod of the late one's name (its UID another) is not touched.
	if err := client.CoreV1().Pods("lab").Delete(ctx, "late", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := late.DeepCopy()
	again.UID = "l2"
	if _, err := client.CoreV1().Pods("lab").Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	tr.Prune(ctx)
	if p, err := client.CoreV1().Pods("lab").Get(ctx, "late", metav1.GetOptions{}); err != nil || p.UID != "l2" {
		t.Errorf("the new pod named late: %v, %v", p, err)
	}
	const released = "pod lab/hoarder was refused its GPUs for 1m0s, holding 31 slot(s): deleted to free them"
	if len(ev.with("Pod/hoarder GPUSlotsReleased", released)) != 1 || len(ev.with("Node/n8 GPUSlotsReleased", released)) != 1 {
		t.Errorf("no GPUSlotsReleased event on the hoarder and the node: %q", ev.all)
	}
	if got := ev.with("Pod/late GPUSlotsReleased", ""); len(got) != 0 {
		t.Errorf("a release reported for late, whose name is another pod's now: %q", got)
	}
}

// TestRefusedPodsAreReported: a pod refused its GPUs keeps its kubelet
// slots until deleted (issue 15: 31 of 32 held while tessera top showed the
// GPUs free). The agent reports it on the pod and the node and in
// tessera_agent_refused_slots, which falls when the pod leaves or its
// container gets its GPUs after all.
func TestRefusedPodsAreReported(t *testing.T) {
	var onNode []*v1.Pod
	ev := &events{node: "n9"}
	tr := New(Config{Node: "n9", Client: fake.NewClientset(), NodeEvent: ev.nodeEvent, PodEvent: ev.podEvent, NodePods: func() []*v1.Pod { return onNode }})
	if got := held(tr, "n9"); got != 0 {
		t.Fatalf("tessera_agent_refused_slots = %v before any refusal, want 0 (exported)", got)
	}
	rogue := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "rogue", UID: "r1"}}
	flaky := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "flaky", UID: "f1"}}
	onNode = []*v1.Pod{rogue, flaky}
	refusal := errors.New("no Tessera GPU assignment covers this container")
	tr.PreStarted(rogue, "main", 2, refusal)
	tr.PreStarted(flaky, "main", 1, refusal)
	if got := held(tr, "n9"); got != 3 || tr.Held() != 3 {
		t.Fatalf("tessera_agent_refused_slots = %v (Held %d), want 3", got, tr.Held())
	}
	tr.PreStarted(flaky, "main", 1, nil) // its next start succeeded
	if got := held(tr, "n9"); got != 2 {
		t.Fatalf("after flaky started: %v, want 2", got)
	}
	onNode = nil // rogue deleted
	tr.Prune(context.Background())
	if got := held(tr, "n9"); got != 0 {
		t.Fatalf("after rogue left: %v, want 0", got)
	}
	if got := ev.with("Pod/rogue GPUSlotsRefused", "container main is refused its GPUs and holds 2 slot(s) of this node until the pod is deleted (by the agent 5m0s after the first refusal): no Tessera GPU assignment"); len(got) != 1 {
		t.Errorf("pod events %q", ev.all)
	}
	if got := ev.with("Node/n9 GPUSlotsHeld", "pod lab/rogue holds 2 GPU slot(s)"); len(got) != 1 {
		t.Errorf("node events %q", ev.all)
	}
}
