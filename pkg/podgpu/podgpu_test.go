package podgpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

var minSlice = config.MinSlice{Training: 8192, Inference: 4096}

func pod(annotations map[string]string, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: annotations}, Spec: v1.PodSpec{Containers: containers}}
}

func ctr(name string, limits map[string]string) v1.Container {
	c := v1.Container{Name: name, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{}}}
	for k, v := range limits {
		c.Resources.Limits[v1.ResourceName(k)] = resource.MustParse(v)
	}
	return c
}

func TestRequest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pod     *v1.Pod
		want    *allocator.Request
		wantErr string
	}{
		{
			name: "whole GPUs and a sidecar",
			pod:  pod(nil, ctr("main", map[string]string{gpu.ResourceGPU: "2"}), ctr("side", nil)),
			want: &allocator.Request{Containers: []allocator.Container{{Name: "main", Count: 2, Whole: true}, {Name: "side"}}, Sharing: gpu.ModeAuto},
		},
		{
			name: "MPS slice for inference",
			pod: pod(map[string]string{gpu.AnnotationSharing: "mps", gpu.AnnotationWorkload: "inference", gpu.AnnotationGPUModel: "H100,A100"},
				ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceMemory: "10240", gpu.ResourceCores: "30"})),
			want: &allocator.Request{Containers: []allocator.Container{{Name: "m", Count: 1, MemoryMiB: 10240, Cores: 300, MinMemoryMiB: 4096}},
				Sharing: gpu.ModeMPS, Models: []string{"H100", "A100"}},
		},
		{
			name: "memory only, for training, at priority 100",
			pod: func() *v1.Pod {
				p := pod(map[string]string{gpu.AnnotationWorkload: "training"}, ctr("m", map[string]string{gpu.ResourceGPU: "2", gpu.ResourceMemory: "4096"}))
				prio := int32(100)
				p.Spec.Priority = &prio
				return p
			}(),
			want: &allocator.Request{Containers: []allocator.Container{{Name: "m", Count: 2, MemoryMiB: 4096, MinMemoryMiB: 8192}}, Sharing: gpu.ModeAuto, Priority: 100},
		},
		{
			name: "exclusive with a size asks for whole GPUs of at least that memory",
			pod: pod(map[string]string{gpu.AnnotationSharing: "exclusive"},
				ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceMemory: "40960"})),
			want: &allocator.Request{Containers: []allocator.Container{{Name: "m", Count: 1, Whole: true, MemoryMiB: 40960}}, Sharing: gpu.ModeExclusive},
		},
		{
			name: "memory-hard time-sliced slice",
			pod: pod(map[string]string{gpu.AnnotationIsolation: "memory-hard", gpu.AnnotationSharing: "time-slicing"},
				ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceCores: "25"})),
			want: &allocator.Request{Containers: []allocator.Container{{Name: "m", Count: 1, Cores: 250}}, Sharing: gpu.ModeTimeSlicing, MemoryHard: true},
		},
		{name: "memory-hard with mps", pod: pod(map[string]string{gpu.AnnotationIsolation: "memory-hard", gpu.AnnotationSharing: "mps"},
			ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceCores: "25"})), wantErr: "use time-slicing, auto or exclusive"},
		{name: "more GPUs than a node holds", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "65"})), wantErr: "no node has more GPUs"},
		{name: "more GPUs over the containers than a node holds", pod: pod(nil, ctr("a", map[string]string{gpu.ResourceGPU: "40"}), ctr("b", map[string]string{gpu.ResourceGPU: "40"})),
			wantErr: "80 GPUs over its containers"},
		{name: "memory beyond any GPU", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceMemory: "2000000"})), wantErr: "must be 1–1048576 MiB"},
		{name: "negative GPUs", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "-1"})), wantErr: "out of range"},
		{name: "unknown workload", pod: pod(map[string]string{gpu.AnnotationWorkload: "batch"}, ctr("m", map[string]string{gpu.ResourceGPU: "1"})), wantErr: "want training or inference"},
		{name: "cores over 100", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceCores: "150"})), wantErr: "must be 1–100"},
		{name: "fractional memory", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceMemory: "1500m"})), wantErr: "whole number"},
		{name: "memory without GPU count", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceMemory: "4096"})), wantErr: "is 0"},
		{name: "unknown mode", pod: pod(map[string]string{gpu.AnnotationSharing: "mig"}, ctr("m", map[string]string{gpu.ResourceGPU: "1"})), wantErr: "want one of exclusive"},
		{name: "cores 0 said", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceCores: "0"})), wantErr: "tessera.dev/gpu-cores=0: must be 1–100"},
		{name: "cores 0 beside memory", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceMemory: "4096", gpu.ResourceCores: "0"})), wantErr: "tessera.dev/gpu-cores=0"},
		{name: "memory 0 said", pod: pod(nil, ctr("m", map[string]string{gpu.ResourceGPU: "1", gpu.ResourceMemory: "0", gpu.ResourceCores: "20"})), wantErr: "tessera.dev/gpu-memory=0: must be at least 1"},
		{name: "a huge annotation is not echoed", pod: pod(map[string]string{gpu.AnnotationSharing: strings.Repeat("x", 100_000)}, ctr("m", map[string]string{gpu.ResourceGPU: "1"})), wantErr: `"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"… (100000 bytes): want one of exclusive`},
		{name: "mps without a size", pod: pod(map[string]string{gpu.AnnotationSharing: "mps"}, ctr("m", map[string]string{gpu.ResourceGPU: "1"})), wantErr: "needs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Request(tc.pod, minSlice)
			if err != nil && len(err.Error()) > 400 {
				t.Fatalf("a %d-byte message echoes the pod's values in full", len(err.Error()))
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, gpu.ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
			if err := got.Check(); err != nil {
				t.Errorf("the allocator refuses what podgpu accepted: %v", err)
			}
		})
	}
}

func TestRequestLimitsAndRequestsMustAgree(t *testing.T) {
	c := ctr("m", map[string]string{gpu.ResourceGPU: "1"})
	c.Resources.Requests = v1.ResourceList{gpu.ResourceGPU: resource.MustParse("2")}
	if _, err := Request(pod(nil, c), minSlice); err == nil || !strings.Contains(err.Error(), "differs from its limit") {
		t.Fatalf("err = %v", err)
	}
	c.Resources.Limits = nil
	r, err := Request(pod(nil, c), minSlice)
	if err != nil || r.Containers[0].Count != 2 {
		t.Fatalf("requests only: %+v, %v", r, err)
	}
}

func TestInitContainerGPUsRefused(t *testing.T) {
	p := pod(nil, ctr("m", nil))
	p.Spec.InitContainers = []v1.Container{ctr("init", map[string]string{gpu.ResourceGPU: "1"})}
	if !WantsGPU(p) {
		t.Fatal("WantsGPU = false for an init container with a GPU")
	}
	if _, err := Request(p, minSlice); err == nil || !strings.Contains(err.Error(), "init container init") {
		t.Fatalf("err = %v", err)
	}
}

func TestBoundAssignment(t *testing.T) {
	a := &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-1", Index: 0, MemoryMiB: 81920, CoresPerMille: 1000}}}}}
	enc, err := gpu.EncodeAssignment(a)
	if err != nil {
		t.Fatal(err)
	}
	p := pod(map[string]string{gpu.AnnotationAssignment: enc}, ctr("m", map[string]string{gpu.ResourceGPU: "1"}))
	if got, err := BoundAssignment(p); got != nil || err != nil {
		t.Errorf("unbound pod: %v, %v; want nothing booked", got, err)
	}
	p.Spec.NodeName = "n1"
	if got, err := BoundAssignment(p); err != nil || !cmp.Equal(got, a) {
		t.Errorf("bound pod: %v, %v", got, err)
	}
	p.Status.Phase = v1.PodSucceeded
	if got, _ := BoundAssignment(p); got != nil {
		t.Errorf("finished pod still booked: %v", got)
	}
	p.Status.Phase = v1.PodRunning
	p.Spec.NodeName = "n2"
	if _, err := BoundAssignment(p); err == nil {
		t.Error("assignment for n1 on a pod bound to n2 accepted")
	}
	p.Annotations[gpu.AnnotationAssignment] = "{garbage"
	if _, err := Assignment(p); err == nil {
		t.Error("garbage annotation accepted")
	}
}
