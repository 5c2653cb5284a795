package scheduler

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestWithoutTesseraResources(t *testing.T) {
	lim := v1.ResourceList{"tessera.dev/gpu": resource.MustParse("1"), "tessera.dev/gpu-memory": resource.MustParse("8192"),
		v1.ResourceCPU: resource.MustParse("2"), "example.com/fpga": resource.MustParse("1")}
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{Limits: lim, Requests: lim.DeepCopy()}}}}}
	got := withoutTesseraResources(pod)
	for _, l := range []v1.ResourceList{got.Spec.Containers[0].Resources.Limits, got.Spec.Containers[0].Resources.Requests} {
		if _, ok := l["tessera.dev/gpu"]; ok || len(l) != 2 {
			t.Fatalf("stripped resources %v, want cpu and example.com/fpga only", l)
		}
	}
	if len(pod.Spec.Containers[0].Resources.Limits) != 4 {
		t.Fatal("the scheduler's pod was modified")
	}
	plain := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "m"}}}}
	if withoutTesseraResources(plain) != plain {
		t.Fatal("a pod without tessera.dev resources was copied")
	}
}
