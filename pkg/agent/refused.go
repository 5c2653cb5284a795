package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// refusedSlots is the metric of slots held by refused pods.
var refusedSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "tessera_agent_refused_slots",
	Help: "Device-plugin slots held by pods whose GPUs the agent refused: kubelet gives them to no other pod until those pods are deleted.",
}, []string{"node"})

// refusedPod is a pod the device plugin refused its GPUs, and the slots its
// containers hold.
type refusedPod struct {
	namespace, name string
	slots           map[string]int // container → slots
}

// preStarted follows the device plugin's PreStartContainer answers: a pod
// refused its GPUs still holds its slots in kubelet until it is deleted,
// so other pods placed on the node would be rejected for want of slots. It
// is reported — events on the pod and the node, tessera_agent_refused_slots
// — and tessera-scheduler, which counts the node's slots as kubelet does,
// places nothing on them.
func (a *Agent) preStarted(pod *v1.Pod, container string, slots int, err error) {
	a.refusedMu.Lock()
	if a.refused == nil {
		a.refused = map[types.UID]*refusedPod{}
	}
	r := a.refused[pod.UID]
	switch {
	case err == nil && r != nil:
		delete(r.slots, container)
		if len(r.slots) == 0 {
			delete(a.refused, pod.UID)
		}
	case err != nil:
		if r == nil {
			r = &refusedPod{namespace: pod.Namespace, name: pod.Name, slots: map[string]int{}}
			a.refused[pod.UID] = r
		}
		r.slots[container] = slots
	}
	total := a.refusedTotalLocked()
	a.refusedMu.Unlock()
	refusedSlots.WithLabelValues(a.opts.Node).Set(float64(total))
	if err == nil {
		return
	}
	ctx, now := context.Background(), time.Now()
	a.eventOn(ctx, now, v1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		v1.EventTypeWarning, "GPUSlotsRefused", "Refuse",
		fmt.Sprintf("container %s is refused its GPUs and holds %d slot(s) of this node until the pod is deleted: %v", container, slots, err))
	a.event(ctx, now, v1.EventTypeWarning, "GPUSlotsHeld", "Refuse",
		fmt.Sprintf("pod %s/%s holds %d GPU slot(s) that kubelet gives to no other pod until it is deleted: its GPUs were refused", pod.Namespace, pod.Name, slots))
}

func (a *Agent) refusedTotalLocked() int {
	total := 0
	for _, r := range a.refused {
		for _, n := range r.slots {
			total += n
		}
	}
	return total
}

// pruneRefused forgets refused pods that left the node (their slots with
// them).
func (a *Agent) pruneRefused(ctx context.Context) {
	if a.opts.NodePods == nil {
		return
	}
	onNode := map[types.UID]bool{}
	for _, p := range a.opts.NodePods() {
		onNode[p.UID] = true
	}
	a.refusedMu.Lock()
	for uid, r := range a.refused {
		if !onNode[uid] {
			klog.FromContext(ctx).V(2).Info("A refused pod left; its slots are free", "pod", klog.KRef(r.namespace, r.name))
			delete(a.refused, uid)
		}
	}
	total := a.refusedTotalLocked()
	a.refusedMu.Unlock()
	refusedSlots.WithLabelValues(a.opts.Node).Set(float64(total))
}
