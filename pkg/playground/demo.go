package playground

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// DemoNamespace holds the sample workload.
const DemoNamespace = "demo"

// PodSpec describes one GPU pod of a workload in the user-facing contract's
// terms.
type PodSpec struct {
	Name string
	// GPUs is tessera.dev/gpu; MemoryMiB and Cores are per GPU (0 and 0
	// ask for whole GPUs).
	GPUs      int
	MemoryMiB int64
	Cores     int
	Sharing   gpu.SharingMode
	Workload  gpu.WorkloadClass
	// PriorityClass is one of deploy/priorityclasses.yaml's.
	PriorityClass string
}

// DemoWorkload is training and inference, on whole GPUs, MPS and
// time-sliced slices, at two priorities (plus best-effort batch): what
// `tessera up --demo` submits.
func DemoWorkload() []PodSpec {
	var w []PodSpec
	add := func(n int, s PodSpec) {
		name := s.Name
		for i := range n {
			s.Name = fmt.Sprintf("%s-%d", name, i)
			w = append(w, s)
		}
	}
	add(2, PodSpec{Name: "train-whole", GPUs: 1, Sharing: gpu.ModeExclusive, Workload: gpu.WorkloadTraining, PriorityClass: "gpu-standard"})
	add(1, PodSpec{Name: "train-2gpu", GPUs: 2, Sharing: gpu.ModeExclusive, Workload: gpu.WorkloadTraining, PriorityClass: "gpu-standard"})
	add(2, PodSpec{Name: "finetune-mps", GPUs: 1, MemoryMiB: 20480, Cores: 40, Sharing: gpu.ModeMPS, Workload: gpu.WorkloadTraining, PriorityClass: "gpu-standard"})
	add(6, PodSpec{Name: "infer-mps", GPUs: 1, MemoryMiB: 8192, Cores: 20, Sharing: gpu.ModeMPS, Workload: gpu.WorkloadInference, PriorityClass: "gpu-critical"})
	add(4, PodSpec{Name: "infer-ts", GPUs: 1, MemoryMiB: 10240, Cores: 25, Sharing: gpu.ModeTimeSlicing, Workload: gpu.WorkloadInference, PriorityClass: "gpu-critical"})
	add(3, PodSpec{Name: "batch-ts", GPUs: 1, MemoryMiB: 16384, Cores: 30, Sharing: gpu.ModeTimeSlicing, Workload: gpu.WorkloadTraining, PriorityClass: "gpu-batch"})
	return w
}

// Pod is the pod a user would write for s, for tessera-scheduler.
func (s PodSpec) Pod(namespace string) *v1.Pod {
	limits := v1.ResourceList{gpu.ResourceGPU: *resource.NewQuantity(int64(s.GPUs), resource.DecimalSI)}
	if s.MemoryMiB > 0 {
		limits[gpu.ResourceMemory] = *resource.NewQuantity(s.MemoryMiB, resource.DecimalSI)
	}
	if s.Cores > 0 {
		limits[gpu.ResourceCores] = *resource.NewQuantity(int64(s.Cores), resource.DecimalSI)
	}
	ann := map[string]string{}
	if s.Sharing != "" {
		ann[gpu.AnnotationSharing] = string(s.Sharing)
	}
	if s.Workload != "" {
		ann[gpu.AnnotationWorkload] = string(s.Workload)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: namespace, Annotations: ann, Labels: map[string]string{"app": "tessera-demo"}},
		Spec: v1.PodSpec{
			SchedulerName:     "tessera-scheduler",
			PriorityClassName: s.PriorityClass,
			Containers: []v1.Container{{
				Name: "main", Image: "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
				Resources: v1.ResourceRequirements{
					Limits:   limits,
					Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("8Gi")},
				},
			}},
		},
	}
}

// Submit creates the pods in namespace (created if missing).
func Submit(ctx context.Context, client kubernetes.Interface, namespace string, specs []PodSpec) error {
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, s := range specs {
		if _, err := client.CoreV1().Pods(namespace).Create(ctx, s.Pod(namespace), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("pod %s: %w", s.Name, err)
		}
	}
	return nil
}

// ClaimPod is a pod asking for a slice with a ResourceClaim of the DRA
// driver's DeviceClass (memory and cores as consumable capacity) instead
// of the extended resources: it runs on a DRA node (Options.DRANodes).
type ClaimPod struct {
	Name      string
	MemoryMiB int64
	Cores     int
}

// SubmitClaims creates each pod and its claim (named as the pod) in
// namespace (created if missing).
func SubmitClaims(ctx context.Context, client kubernetes.Interface, namespace string, pods []ClaimPod) error {
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, cp := range pods {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: cp.Name, Namespace: namespace},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpu.DRADriver, Capacity: &resourceapi.CapacityRequirements{
					Requests: map[resourceapi.QualifiedName]resource.Quantity{
						"memory": *resource.NewQuantity(cp.MemoryMiB<<20, resource.BinarySI),
						"cores":  *resource.NewQuantity(int64(cp.Cores), resource.DecimalSI)}}}}}}}}
		if _, err := client.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("claim %s: %w", cp.Name, err)
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: cp.Name, Namespace: namespace},
			Spec: v1.PodSpec{SchedulerName: "tessera-scheduler", ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
				Containers: []v1.Container{{Name: "main", Image: "registry.example/workload", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}}
		if _, err := client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("pod %s: %w", cp.Name, err)
		}
	}
	return nil
}

// Settled is how a workload ended up: pods Running, and the others with
// what keeps them.
type Settled struct {
	Running      int
	FirstRunning time.Time
	Waiting      map[string]string // pod → reason
}

// WaitSettled waits until every pod of namespace runs, or until timeout
// passes with no change; it returns how they stand.
func WaitSettled(ctx context.Context, client kubernetes.Interface, namespace string, timeout time.Duration) (Settled, error) {
	var s Settled
	first := map[string]time.Time{}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		s = Settled{Waiting: map[string]string{}}
		for _, p := range pods.Items {
			if p.Status.Phase == v1.PodRunning {
				s.Running++
				if _, ok := first[p.Name]; !ok {
					first[p.Name] = time.Now()
				}
				continue
			}
			s.Waiting[p.Name] = waitingReason(&p)
		}
		return len(s.Waiting) == 0 && s.Running > 0, nil
	})
	for _, t := range first {
		if s.FirstRunning.IsZero() || t.Before(s.FirstRunning) {
			s.FirstRunning = t
		}
	}
	if err != nil && ctx.Err() == nil {
		err = nil // timed out: report how they stand
	}
	return s, err
}

func waitingReason(p *v1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return c.Message
		}
	}
	for _, st := range p.Status.ContainerStatuses {
		if st.State.Waiting != nil {
			return st.State.Waiting.Reason + ": " + st.State.Waiting.Message
		}
	}
	if p.Status.Reason != "" {
		return p.Status.Reason + ": " + p.Status.Message
	}
	return string(p.Status.Phase)
}
