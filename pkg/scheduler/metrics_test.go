package scheduler

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metricstestutil "k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// TestStaleSeriesGo: a GPU that leaves a node's inventory loses its series,
// and the orphan gauge follows pods that leave (issue 15: series stayed
// forever, and orphaned_pods stayed at 6 after the pods were gone).
func TestStaleSeriesGo(t *testing.T) {
	registerMetrics()
	p := &Plugin{shared: &shared{cache: cache.New(1.5)}}
	var gone []string
	p.cache.ReportUntil(context.Background(), nil, func(name string, gpus []allocator.GPU) {
		for _, g := range gpus {
			gone = append(gone, name+"/"+g.UUID)
		}
	})
	if _, err := p.cache.SetNode("v1", schedtest.Inventory("n1", 3, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.cache.SetNode("v2", schedtest.Inventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(gone) != "[n1/GPU-n1-2]" {
		t.Fatalf("series dropped for %v, want GPU-n1-2's", gone)
	}

	logger := klog.Background()
	a, _ := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "elsewhere", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-x", MemoryMiB: 81920, CoresPerMille: 1000}}}}})
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1", Annotations: map[string]string{gpu.AnnotationAssignment: a}},
		Spec: v1.PodSpec{NodeName: "elsewhere", Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{gpu.ResourceGPU: resource.MustParse("1")}}}}}}
	p.onPod(logger, pod, false)
	if v, _ := metricstestutil.GetGaugeMetricValue(orphanedPods); v != 1 {
		t.Fatalf("orphaned_pods = %v with one pod on a node without inventory", v)
	}
	p.onPodDelete(pod)
	if v, _ := metricstestutil.GetGaugeMetricValue(orphanedPods); v != 0 {
		t.Fatalf("orphaned_pods = %v after the pod left", v)
	}
}
