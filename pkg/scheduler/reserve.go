package scheduler

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// Reserve books the pod's GPUs on the chosen node. It places again under the
// node's lock: the usage may have changed since Filter. A pod's claims'
// allocation is signalled to the claim tracker (claims.go).
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	defer observe("Reserve", time.Now())
	if st := p.reserveGPU(ctx, state, pod, nodeName); st != nil || readClaims(state) == nil {
		return st
	}
	return p.claims.inner.Reserve(ctx, state, pod, nodeName)
}

func (p *Plugin) reserveGPU(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s := readState(state)
	if s == nil {
		return nil
	}
	asg, reason, err := p.cache.Reserve(s.alloc, pod.UID, podKey(pod), nodeName, s.req)
	if err != nil {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("node %s lost its GPU inventory", nodeName))
	}
	if !reason.OK() {
		return fwk.NewStatus(fwk.Unschedulable, reason.String())
	}
	s.assignment = asg
	p.pending.placed(pod.UID)
	p.waiting.forget(pod.UID)
	klog.FromContext(ctx).V(4).Info("Reserved GPUs", "pod", klog.KObj(pod), "node", nodeName, "assignment", asg)
	return nil
}

// Unreserve releases a booking whose pod did not bind.
func (p *Plugin) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) {
	defer observe("Unreserve", time.Now())
	if readClaims(state) != nil {
		p.claims.inner.Unreserve(ctx, state, pod, nodeName)
	}
	if s := readState(state); s != nil {
		p.cache.ForgetAssumed(pod.UID)
		s.assignment = nil
		p.waiting.wake(p.cache, klog.FromContext(ctx))
	}
}
