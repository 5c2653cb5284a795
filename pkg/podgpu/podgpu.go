// Package podgpu translates between Kubernetes pods and Tessera's domain
// types: it reads a pod's GPU request from its containers' tessera.dev
// resources and annotations, and reads or writes the scheduler's assignment
// annotation. The scheduler plugin and the node agent both use it, so both
// sides read a pod the same way.
//
// It imports only k8s.io/api and k8s.io/apimachinery, never k8s.io/kubernetes.
package podgpu

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// resourceNames are the per-container resources of the user-facing contract.
var resourceNames = [...]v1.ResourceName{gpu.ResourceGPU, gpu.ResourceMemory, gpu.ResourceCores}

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

// Request reads the pod's GPU request. It returns an error wrapping
// gpu.ErrInvalid, phrased for the pod's owner, when the request is malformed:
// a non-integer or out-of-range quantity, requests and limits that differ, an
// init container asking for GPUs, an unknown annotation value, or fields that
// contradict each other. Containers without GPU resources are kept (GPUs 0)
// so that container positions match the pod spec.
func Request(pod *v1.Pod) (*gpu.Request, error) {
	for i := range pod.Spec.InitContainers {
		if containerNames(&pod.Spec.InitContainers[i]) {
			return nil, fmt.Errorf("%w: init container %s asks for tessera.dev resources; only regular containers can hold GPUs",
				gpu.ErrInvalid, pod.Spec.InitContainers[i].Name)
		}
	}
	r := &gpu.Request{Containers: make([]gpu.ContainerRequest, len(pod.Spec.Containers))}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		cr := gpu.ContainerRequest{Name: c.Name}
		var err error
		var n int64
		if n, err = quantity(c, gpu.ResourceGPU, 1<<10); err != nil {
			return nil, err
		}
		cr.GPUs = int(n)
		if cr.MemoryMiB, err = quantity(c, gpu.ResourceMemory, 1<<30); err != nil {
			return nil, err
		}
		if n, err = quantity(c, gpu.ResourceCores, 1<<10); err != nil {
			return nil, err
		}
		cr.CoresPercent = int(n)
		// 0 would read as "not given", which means something else (a
		// whole GPU, or cores matching the memory): say so instead.
		if given(c, gpu.ResourceCores) && cr.CoresPercent == 0 {
			return nil, fmt.Errorf("%w: container %s: %s=0: must be 1–100 (percent of one GPU's SMs); leave it out to get the share matching %s, or a whole GPU",
				gpu.ErrInvalid, c.Name, gpu.ResourceCores, gpu.ResourceMemory)
		}
		if given(c, gpu.ResourceMemory) && cr.MemoryMiB == 0 {
			return nil, fmt.Errorf("%w: container %s: %s=0: must be at least 1 (MiB per GPU); leave it out to get the memory matching %s, or a whole GPU",
				gpu.ErrInvalid, c.Name, gpu.ResourceMemory, gpu.ResourceCores)
		}
		r.Containers[i] = cr
	}
	if err := r.ApplyAnnotations(pod.Annotations); err != nil {
		return nil, err
	}
	if pod.Spec.Priority != nil {
		r.Priority = *pod.Spec.Priority
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
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
		return 0, fmt.Errorf("%w: container %s: %s=%d is out of range (0–%d)", gpu.ErrInvalid, c.Name, name, v, max)
	}
	return v, nil
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
