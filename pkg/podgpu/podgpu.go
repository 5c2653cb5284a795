// Package podgpu translates between Kubernetes pods and Tessera's domain
// types: it reads a pod's GPU request from its containers' tessera.dev
// resources and annotations, and reads or writes the scheduler's assignment
// annotation. The scheduler plugin, `tessera top` and the soak read a pod's
// request here; the node agent reads assignments here, so every side reads a
// pod the same way.
//
// # From what the user wrote to what the allocator places
//
// Request is the one road from a pod to an allocator.Request: it parses and
// validates in one pass, phrasing every refusal for the pod's owner (wrapping
// gpu.ErrInvalid), and what it returns always passes allocator.Request.Check.
// The mapping:
//
//	the pod says (per container)          allocator.Container
//	tessera.dev/gpu: N                    Count N (0–64; no container without it may name the others)
//	neither gpu-memory nor gpu-cores      Whole: N entire GPUs, exclusively
//	tessera.dev/gpu-memory: M             MemoryMiB M per GPU (1 MiB – 1 TiB)
//	tessera.dev/gpu-cores: P              Cores P×10 per-mille of each GPU's SMs (P is 1–100)
//	only one of the two                   the other follows the GPU placed on: memory
//	                                      in proportion to cores, or cores to memory
//
//	the pod says (for all containers)     allocator.Request
//	tessera.dev/sharing: exclusive        every GPU container Whole; a size given then
//	                                      asks for GPUs with at least that memory
//	tessera.dev/sharing: mps|time-slicing Sharing; each GPU container must give a size
//	tessera.dev/sharing absent or auto    Sharing auto: the GPU's mode decides
//	tessera.dev/workload: training        every container's MinMemoryMiB = the scheduler
//	tessera.dev/workload: inference       config's minSliceMiB.training (…inference): a
//	                                      smaller slice is rounded up to it, and whole
//	                                      GPUs smaller than it are not chosen
//	tessera.dev/gpu-model: A,B            Models (any of them; absent means any model)
//	tessera.dev/isolation: memory-hard    MemoryHard (not with sharing=mps)
//	spec.priority                         Priority
//
// A request and a limit of the same resource must be equal when both are
// given, and must be whole numbers. Init containers may not ask for GPUs.
// The pod's CPU and memory are not the allocator's business on this road:
// kube-scheduler's NodeResourcesFit checks them (CPUMilli and MemoryMiB stay
// 0; the simulator, which has no kube-scheduler, fills them from its traces).
//
// It imports only k8s.io/api and k8s.io/apimachinery, never k8s.io/kubernetes.
package podgpu

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// resourceNames are the per-container resources of the user-facing contract.
var resourceNames = [...]v1.ResourceName{gpu.ResourceGPU, gpu.ResourceMemory, gpu.ResourceCores}

// Upper bounds of the per-container quantities, beyond which no GPU could
// ever serve the request.
const (
	maxMemoryMiB = 1 << 20 // 1 TiB per GPU
	maxCores     = 100     // percent of one GPU's SMs
)

// WantsGPU reports whether any container of the pod names a tessera.dev
// resource. Pods that do not are none of Tessera's business.
func WantsGPU(pod *v1.Pod) bool {
	for i := range pod.Spec.Containers {
		if containerNames(&pod.Spec.Containers[i]) {
			return true
		}
	}
	for i := range pod.Spec.InitContainers {
		if containerNames(&pod.Spec.InitContainers[i]) {
			return true
		}
	}
	return false
}

func containerNames(c *v1.Container) bool {
	for _, n := range resourceNames {
		if _, ok := c.Resources.Limits[n]; ok {
			return true
		}
		if _, ok := c.Resources.Requests[n]; ok {
			return true
		}
	}
	return false
}

// Request reads the pod's GPU request and resolves it for placement (the
// package doc gives the mapping). minSlice comes from the scheduler's config
// (allocator.minSliceMiB). It returns an error wrapping gpu.ErrInvalid,
// phrased for the pod's owner, when the request is malformed: a non-integer
// or out-of-range quantity, requests and limits that differ, an init
// container asking for GPUs, an unknown annotation value, or fields that
// contradict each other. Containers without GPU resources are kept (Count 0)
// so that container positions match the pod spec.
func Request(pod *v1.Pod, minSlice config.MinSlice) (*allocator.Request, error) {
	for i := range pod.Spec.InitContainers {
		if containerNames(&pod.Spec.InitContainers[i]) {
			return nil, fmt.Errorf("%w: init container %s asks for tessera.dev resources; only regular containers can hold GPUs",
				gpu.ErrInvalid, pod.Spec.InitContainers[i].Name)
		}
	}
	r := &allocator.Request{Containers: make([]allocator.Container, len(pod.Spec.Containers))}
	minMem, err := podLevel(r, pod, minSlice)
	if err != nil {
		return nil, err
	}
	total := 0
	for i := range pod.Spec.Containers {
		c, err := container(&pod.Spec.Containers[i], r.Sharing)
		if err != nil {
			return nil, err
		}
		c.MinMemoryMiB = minMem
		total += c.Count
		r.Containers[i] = c
	}
	if total > allocator.MaxGPUsPerNode {
		return nil, fmt.Errorf("%w: the pod asks for %d GPUs over its containers; no node has more than %d",
			gpu.ErrInvalid, total, allocator.MaxGPUsPerNode)
	}
	return r, nil
}

// podLevel fills the fields annotations and the pod spec give for every
// container, and returns the workload class's minimum slice.
func podLevel(r *allocator.Request, pod *v1.Pod, minSlice config.MinSlice) (minMem int64, err error) {
	sharing, err := gpu.ParseSharingMode(pod.Annotations[gpu.AnnotationSharing])
	if err != nil {
		return 0, err
	}
	workload, err := gpu.ParseWorkloadClass(pod.Annotations[gpu.AnnotationWorkload])
	if err != nil {
		return 0, err
	}
	switch workload {
	case gpu.WorkloadTraining:
		minMem = minSlice.Training
	case gpu.WorkloadInference:
		minMem = minSlice.Inference
	}
	if r.Models, err = gpu.ParseModelList(pod.Annotations[gpu.AnnotationGPUModel]); err != nil {
		return 0, err
	}
	if r.MemoryHard, err = gpu.ParseIsolation(pod.Annotations[gpu.AnnotationIsolation]); err != nil {
		return 0, err
	}
	if r.MemoryHard && sharing == gpu.ModeMPS {
		return 0, fmt.Errorf("%w: %s=%s with %s=mps: MPS slices' memory is not held by the kernel; use time-slicing, auto or exclusive",
			gpu.ErrInvalid, gpu.AnnotationIsolation, gpu.IsolationMemoryHard, gpu.AnnotationSharing)
	}
	r.Sharing = sharing
	if pod.Spec.Priority != nil {
		r.Priority = *pod.Spec.Priority
	}
	return minMem, nil
}

// container reads one container's tessera.dev resources.
func container(c *v1.Container, sharing gpu.SharingMode) (allocator.Container, error) {
	out := allocator.Container{Name: c.Name}
	n, err := quantity(c, gpu.ResourceGPU, allocator.MaxGPUsPerNode)
	if err != nil {
		return out, err
	}
	mem, err := quantity(c, gpu.ResourceMemory, maxMemoryMiB)
	if err != nil {
		return out, err
	}
	cores, err := quantity(c, gpu.ResourceCores, maxCores)
	if err != nil {
		return out, err
	}
	// 0 would read as "not given", which means something else (a
	// whole GPU, or cores matching the memory): say so instead.
	if given(c, gpu.ResourceCores) && cores == 0 {
		return out, fmt.Errorf("%w: container %s: %s=0: must be 1–100 (percent of one GPU's SMs); leave it out to get the share matching %s, or a whole GPU",
			gpu.ErrInvalid, c.Name, gpu.ResourceCores, gpu.ResourceMemory)
	}
	if given(c, gpu.ResourceMemory) && mem == 0 {
		return out, fmt.Errorf("%w: container %s: %s=0: must be at least 1 (MiB per GPU); leave it out to get the memory matching %s, or a whole GPU",
			gpu.ErrInvalid, c.Name, gpu.ResourceMemory, gpu.ResourceCores)
	}
	sized := mem > 0 || cores > 0
	switch {
	case n == 0 && sized:
		return out, fmt.Errorf("%w: container %s: asks for %s or %s but %s is 0 or absent; say how many GPUs",
			gpu.ErrInvalid, c.Name, gpu.ResourceMemory, gpu.ResourceCores, gpu.ResourceGPU)
	case n > 0 && !sized && (sharing == gpu.ModeMPS || sharing == gpu.ModeTimeSlicing):
		return out, fmt.Errorf("%w: container %s: %s=%s needs %s or %s to size the slice",
			gpu.ErrInvalid, c.Name, gpu.AnnotationSharing, sharing, gpu.ResourceMemory, gpu.ResourceCores)
	}
	out.Count = int(n)
	out.Whole = n > 0 && (!sized || sharing == gpu.ModeExclusive)
	out.MemoryMiB = mem
	out.Cores = int(cores) * gpu.CoresPerGPU / 100
	return out, nil
}

// Slots is how many device-plugin slots (tessera.dev/gpu) a pod's
// containers take from kubelet.
func Slots(pod *v1.Pod) int64 {
	var n int64
	for i := range pod.Spec.Containers {
		r := pod.Spec.Containers[i].Resources
		q, ok := r.Limits[gpu.ResourceGPU]
		if !ok {
			q = r.Requests[gpu.ResourceGPU]
		}
		n += q.Value()
	}
	return n
}

// given reports whether a container names the resource at all.
func given(c *v1.Container, name v1.ResourceName) bool {
	_, lim := c.Resources.Limits[name]
	_, req := c.Resources.Requests[name]
	return lim || req
}

// quantity reads one tessera.dev resource of a container as a whole number.
// Extended resources cannot be overcommitted, so when both are given the
// request must equal the limit (the API server enforces that too; checking it
// here keeps the message ours).
func quantity(c *v1.Container, name v1.ResourceName, max int64) (int64, error) {
	lim, hasLim := c.Resources.Limits[name]
	req, hasReq := c.Resources.Requests[name]
	q := lim
	switch {
	case hasLim && hasReq && lim.Cmp(req) != 0:
		return 0, fmt.Errorf("%w: container %s: %s request %s differs from its limit %s; give one value",
			gpu.ErrInvalid, c.Name, name, req.String(), lim.String())
	case !hasLim && !hasReq:
		return 0, nil
	case !hasLim:
		q = req
	}
	v, ok := q.AsInt64()
	if !ok || q.Cmp(*resource.NewQuantity(v, q.Format)) != 0 {
		return 0, fmt.Errorf("%w: container %s: %s=%s must be a whole number", gpu.ErrInvalid, c.Name, name, q.String())
	}
	if v < 0 || v > max {
		return 0, fmt.Errorf("%w: container %s: %s=%d is out of range (%s)", gpu.ErrInvalid, c.Name, name, v, rangeOf(name, max))
	}
	return v, nil
}

// rangeOf says what a resource accepts, in the words of its documentation.
func rangeOf(name v1.ResourceName, max int64) string {
	switch name {
	case gpu.ResourceCores:
		return "must be 1–100, percent of one GPU's SMs"
	case gpu.ResourceMemory:
		return fmt.Sprintf("must be 1–%d MiB per GPU", max)
	}
	return fmt.Sprintf("0–%d; no node has more GPUs", max)
}

// Assignment reads the scheduler's assignment from the pod, or nil when it has
// none. A present but undecodable annotation is an error.
func Assignment(pod *v1.Pod) (*gpu.PodAssignment, error) {
	s, ok := pod.Annotations[gpu.AnnotationAssignment]
	if !ok {
		return nil, nil
	}
	a, err := gpu.DecodeAssignment(s)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: annotation %s: %w", pod.Namespace, pod.Name, gpu.AnnotationAssignment, err)
	}
	return a, nil
}

// BoundAssignment is Assignment for a pod the cluster counts against a node:
// bound (spec.nodeName set), not finished, and carrying an assignment for that
// very node. Anything else — an unbound pod whose annotation is left over from
// a scheduling attempt that never bound, or an assignment naming another node —
// books nothing.
func BoundAssignment(pod *v1.Pod) (*gpu.PodAssignment, error) {
	if pod.Spec.NodeName == "" || Finished(pod) {
		return nil, nil
	}
	a, err := Assignment(pod)
	if err != nil || a == nil {
		return nil, err
	}
	if a.Node != pod.Spec.NodeName {
		return nil, fmt.Errorf("pod %s/%s: assignment is for node %s but the pod is bound to %s",
			pod.Namespace, pod.Name, a.Node, pod.Spec.NodeName)
	}
	return a, nil
}

// Finished reports whether the pod's containers have stopped for good, so its
// GPUs are free again.
func Finished(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}
