package scheduler

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Bind binds a GPU pod with its assignment in one write: the binding's
// annotations are merged onto the pod by the API server in the same update
// that sets its node, so a pod is never bound without its assignment, nor
// left with an assignment for a binding that failed — and it costs one
// request instead of a patch plus a binding. Pods without GPUs are left to
// DefaultBinder (Skip); the shipped config runs TesseraGPU first at bind.
func (p *Plugin) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := readState(state)
	if s == nil || s.assignment == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	defer observe("Bind", time.Now())
	enc, err := gpu.EncodeAssignment(s.assignment)
	if err != nil {
		return fwk.AsStatus(err)
	}
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
		Target: v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := p.handle.ClientSet().CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fwk.AsStatus(fmt.Errorf("bind pod %s to %s with its GPU assignment: %w", podKey(pod), nodeName, err))
	}
	return nil
}
