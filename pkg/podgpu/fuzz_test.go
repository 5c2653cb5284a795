package podgpu

import (
	"errors"
	"testing"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// FuzzRequest: whatever a pod says, Request either refuses it with an
// ErrInvalid message of bounded length, or returns a request the allocator
// accepts (Check) — the allocator never re-validates a pod's request, so
// this is what lets it trust podgpu.
func FuzzRequest(f *testing.F) {
	f.Add("1", "", "", "", "", "", "", "", "")
	f.Add("2", "10240", "30", "", "mps", "inference", "", "H100,A100", "")
	f.Add("1", "4096", "", "8", "exclusive", "training", "memory-hard", "", "3")
	f.Add("", "4096", "0", "", "time-slicing", "", "", "|", "")
	f.Add("65", "1500m", "150", "1", "auto", "batch", "soft", ",,", "1")
	f.Fuzz(func(t *testing.T, gpus, mem, cores, gpusReq, sharing, workload, isolation, models, sideGPUs string) {
		limits := v1.ResourceList{}
		requests := v1.ResourceList{}
		for _, q := range []struct {
			into  v1.ResourceList
			name  v1.ResourceName
			value string
		}{{limits, gpu.ResourceGPU, gpus}, {limits, gpu.ResourceMemory, mem}, {limits, gpu.ResourceCores, cores}, {requests, gpu.ResourceGPU, gpusReq}} {
			if q.value == "" {
				continue
			}
			v, err := resource.ParseQuantity(q.value)
			if err != nil {
				return // the API server refuses it before any of us sees it
			}
			q.into[q.name] = v
		}
		p := pod(map[string]string{gpu.AnnotationSharing: sharing, gpu.AnnotationWorkload: workload,
			gpu.AnnotationIsolation: isolation, gpu.AnnotationGPUModel: models},
			v1.Container{Name: "main", Resources: v1.ResourceRequirements{Limits: limits, Requests: requests}})
		if sideGPUs != "" {
			v, err := resource.ParseQuantity(sideGPUs)
			if err != nil {
				return
			}
			p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "side", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpu.ResourceGPU: v}}})
		}
		r, err := Request(p, minSlice)
		if err != nil {
			if !errors.Is(err, gpu.ErrInvalid) {
				t.Fatalf("refusal %v does not wrap ErrInvalid", err)
			}
			if n := utf8.RuneCountInString(err.Error()); n > 400 {
				t.Fatalf("a %d-character refusal: %s", n, err)
			}
			return
		}
		if err := r.Check(); err != nil {
			t.Fatalf("podgpu accepted %+v, the allocator refuses it: %v", r, err)
		}
		if len(r.Containers) != len(p.Spec.Containers) {
			t.Fatalf("%d containers read from %d", len(r.Containers), len(p.Spec.Containers))
		}
		for i, c := range r.Containers {
			if got, want := int64(c.Count), Slots(&v1.Pod{Spec: v1.PodSpec{Containers: p.Spec.Containers[i : i+1]}}); got != want {
				t.Fatalf("container %d: %d GPUs placed, %d device-plugin slots taken", i, got, want)
			}
		}
	})
}
