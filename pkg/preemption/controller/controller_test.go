package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics/testutil"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// controller builds a controller over a fake API server holding pods, at
// a fixed time.
func controller(t *testing.T, now time.Time, pods ...*v1.Pod) (*Controller, *fake.Clientset) {
	t.Helper()
	var objs []runtime.Object
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, p := range pods {
		objs = append(objs, p)
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	client := fake.NewClientset(objs...)
	registerMetrics()
	cfg := config.Default().Preemption
	cfg.RecordRetention = 3
	return &Controller{client: client, pods: corelisters.NewPodLister(idx), cfg: cfg, now: func() time.Time { return now },
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]())}, client
}

func victim(name string, noticeAt time.Time, grace time.Duration, ann map[string]string) *v1.Pod {
	n := &preemption.Notice{Preemptor: "prod/urgent", PreemptorUID: "pre-uid", Node: "n1", Reason: "GPU slices", NoticeAt: noticeAt, Deadline: noticeAt.Add(grace)}
	a := map[string]string{preemption.AnnotationNotice: n.Encode()}
	for k, v := range ann {
		a[k] = v
	}
	prio := int32(1000)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "lab", UID: types.UID(name + "-0000-uid"), Annotations: a},
		Spec: v1.PodSpec{NodeName: "n1", Priority: &prio, PriorityClassName: "gpu-batch",
			Containers: []v1.Container{{Name: "train", Image: "example/train:1"}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{Name: "train",
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}},
	}
}

func key(p *v1.Pod) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// preemptor is the pending pod the victims' notices name.
func preemptor(node string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "urgent", Namespace: "prod", UID: "pre-uid"}, Spec: v1.PodSpec{NodeName: node}}
}

// TestNeedlessNoticeIsWithdrawn: a victim whose preemptor was placed
// elsewhere, or went away, is spared before its deadline.
func TestNeedlessNoticeIsWithdrawn(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	for name, pre := range map[string]*v1.Pod{"placed": preemptor("n2"), "gone": nil} {
		t.Run(name, func(t *testing.T) {
			v := victim("lucky", t0, 30*time.Second, nil)
			pods := []*v1.Pod{v}
			if pre != nil {
				pods = append(pods, pre)
			}
			c, client := controller(t, t0.Add(5*time.Second), pods...)
			if _, err := c.sync(context.Background(), key(v)); err != nil {
				t.Fatal(err)
			}
			got, err := client.CoreV1().Pods("lab").Get(context.Background(), "lucky", metav1.GetOptions{})
			if err != nil {
				t.Fatalf("victim stopped: %v", err)
			}
			if preemption.IsVictim(got) {
				t.Error("notice not withdrawn")
			}
		})
	}
}

// TestSyncWaitsThenStopsHard: before the deadline the controller waits; at
// it, it records the scene, stops the victim and tells both pods.
func TestSyncWaitsThenStopsHard(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	v := victim("stubborn", t0, 30*time.Second, nil)
	c, client := controller(t, t0.Add(10*time.Second), v, preemptor(""))
	after, err := c.sync(context.Background(), key(v))
	if err != nil || after != 20*time.Second {
		t.Fatalf("before the deadline: look again after %v (%v), want 20s", after, err)
	}
	c.now = func() time.Time { return t0.Add(31 * time.Second) }
	if _, err := c.sync(context.Background(), key(v)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("lab").Get(context.Background(), "stubborn", metav1.GetOptions{}); err == nil {
		t.Error("victim not deleted at its deadline")
	}
	cms, _ := client.CoreV1().ConfigMaps(preemption.RecordNamespace).List(context.Background(), metav1.ListOptions{})
	if len(cms.Items) != 1 {
		t.Fatalf("%d scene records", len(cms.Items))
	}
	var sc preemption.Scene
	if err := json.Unmarshal([]byte(cms.Items[0].Data["scene.json"]), &sc); err != nil {
		t.Fatal(err)
	}
	if sc.Victim != "lab/stubborn" || sc.Preemptor != "prod/urgent" || sc.Priority != 1000 || !sc.StoppedAt.Equal(t0.Add(31*time.Second)) ||
		sc.Containers[0].Image != "example/train:1" || sc.Containers[0].State.Running == nil {
		t.Errorf("scene %+v", sc)
	}
	evs, _ := client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	reasons := map[string]string{}
	for _, e := range evs.Items {
		reasons[e.Reason] = e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name
	}
	if reasons["PreemptedHard"] != "lab/stubborn" || reasons["VictimStopped"] != "prod/urgent" {
		t.Errorf("events %v", reasons)
	}
}

// TestSyncCheckpointEndsTheWait: a reported checkpoint stops the victim at
// once, with no scene record.
func TestSyncCheckpointEndsTheWait(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	v := victim("saver", t0, 30*time.Second, map[string]string{preemption.AnnotationCheckpointed: t0.Add(time.Second).Format(time.RFC3339)})
	c, client := controller(t, t0.Add(2*time.Second), v, preemptor(""))
	if _, err := c.sync(context.Background(), key(v)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods("lab").Get(context.Background(), "saver", metav1.GetOptions{}); err == nil {
		t.Error("checkpointed victim not stopped")
	}
	if cms, _ := client.CoreV1().ConfigMaps(preemption.RecordNamespace).List(context.Background(), metav1.ListOptions{}); len(cms.Items) != 0 {
		t.Error("a soft preemption left a scene record")
	}
	// A second look queued before the informer saw the deletion (the
	// lister still has the pod) neither stops nor counts it again.
	before, _ := testutil.GetCounterMetricValue(levels.WithLabelValues(LevelSoft))
	if _, err := c.sync(context.Background(), key(v)); err != nil {
		t.Fatal(err)
	}
	if after, _ := testutil.GetCounterMetricValue(levels.WithLabelValues(LevelSoft)); after != before {
		t.Errorf("soft preemptions %v → %v on a second look", before, after)
	}
}

// TestRecordRetention: only the newest recordRetention records are kept.
func TestRecordRetention(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	c, client := controller(t, t0)
	for i := range 5 {
		cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("preempted-%d", 4-i), Namespace: preemption.RecordNamespace,
			Labels: map[string]string{preemption.RecordLabelKey: "true"}, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(i) * time.Minute))}}
		if _, err := client.CoreV1().ConfigMaps(preemption.RecordNamespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.trim(context.Background()); err != nil {
		t.Fatal(err)
	}
	cms, _ := client.CoreV1().ConfigMaps(preemption.RecordNamespace).List(context.Background(), metav1.ListOptions{})
	var names []string
	for _, cm := range cms.Items {
		names = append(names, cm.Name)
	}
	if fmt.Sprint(names) != "[preempted-0 preempted-1 preempted-2]" {
		t.Errorf("kept %v, want the three newest (preempted-0..2)", names)
	}
}
