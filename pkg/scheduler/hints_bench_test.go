package scheduler

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// BenchmarkHintPerDeletion is what one GPU pod's deletion costs the plugin
// while 1,000 pods wait: the framework calls the deletion's queueing hint once
// per waiting pod, and the plugin's informer handler once. The cluster holds
// 1,000 nodes × 8 GPUs, each GPU with one bound pod. Reported per event:
// hint-ns (the 1,000 hint calls) and handler-ns (the handler's one call);
// ns/op adds the bound pod each iteration creates, so it can be deleted.
func BenchmarkHintPerDeletion(b *testing.B) {
	registerMetrics()
	const nodes, gpus, waiting = 1000, 8, 1000
	p := &Plugin{shared: &shared{cache: cache.New(1)}}
	p.synced.Store(true)
	logger := klog.Background()
	boundPod := func(uid string, node string, g int) *v1.Pod {
		enc, err := gpu.EncodeAssignment(schedtest.Grant(node, g, 8192, 100, gpu.ModeTimeSlicing))
		if err != nil {
			b.Fatal(err)
		}
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: uid, UID: types.UID(uid), Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
			Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				gpu.ResourceGPU: resource.MustParse("1"), gpu.ResourceMemory: resource.MustParse("8192"), gpu.ResourceCores: resource.MustParse("10")}}}}}}
	}
	for i := range nodes {
		name := fmt.Sprintf("gpu-node-%04d", i)
		if _, err := p.cache.SetNode(name, schedtest.Inventory(name, gpus, 81920, false)); err != nil {
			b.Fatal(err)
		}
		for g := range gpus {
			p.onPod(logger, boundPod(fmt.Sprintf("%s-%d", name, g), name, g), false)
		}
	}
	waiters := make([]*v1.Pod, waiting)
	for i := range waiters {
		waiters[i] = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: fmt.Sprintf("wait-%d", i), UID: types.UID(fmt.Sprintf("wait-%d", i))}}
	}
	var hint, handler time.Duration
	n := 0
	for b.Loop() {
		node := fmt.Sprintf("gpu-node-%04d", n%nodes)
		gone := boundPod(fmt.Sprintf("churn-%d", n), node, n%gpus)
		n++
		p.onPod(logger, gone, false)
		start := time.Now()
		for _, w := range waiters {
			if _, err := p.hintGPUPodGone(logger, w, gone, nil); err != nil {
				b.Fatal(err)
			}
		}
		mid := time.Now()
		p.onPodDelete(gone)
		hint += mid.Sub(start)
		handler += time.Since(mid)
	}
	b.ReportMetric(float64(hint.Nanoseconds())/float64(n), "hint-ns/event")
	b.ReportMetric(float64(handler.Nanoseconds())/float64(n), "handler-ns/event")
}
