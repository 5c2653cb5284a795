package agent

import (
	"context"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// DefaultRefusedGrace is how long a pod refused its GPUs may hold its
// slots before the agent deletes it (Options.RefusedGrace): long enough
// for an operator to read why, short enough that a pod bound past the
// admission policies cannot hoard a node.
const DefaultRefusedGrace = 5 * time.Minute

// refusedPod is a pod the device plugin refused its GPUs, and the slots its
// containers hold.
type refusedPod struct {
	namespace, name string
	slots           map[string]int // container → slots
	// since is the first refusal: the grace runs from it.
	since time.Time
}

// overdue lists the refused pods whose grace has run out at now, oldest
// first: the pods the agent refuses for good.
func overdue(refused map[types.UID]*refusedPod, now time.Time, grace time.Duration) []types.UID {
	var out []types.UID
	for uid, r := range refused {
		if now.Sub(r.since) >= grace {
			out = append(out, uid)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := refused[out[i]], refused[out[j]]
		if !a.since.Equal(b.since) {
			return a.since.Before(b.since)
		}
		return out[i] < out[j]
	})
	return out
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
			r = &refusedPod{namespace: pod.Namespace, name: pod.Name, slots: map[string]int{}, since: a.now()}
			a.refused[pod.UID] = r
		}
		r.slots[container] = slots
	}
	total := a.refusedTotalLocked()
	a.refusedMu.Unlock()
	a.m.refusedSlots.WithLabelValues(a.opts.Node).Set(float64(total))
	if err == nil {
		return
	}
	ctx := context.Background()
	a.eventOn(ctx, podRef(pod.Namespace, pod.Name, pod.UID), v1.EventTypeWarning, "GPUSlotsRefused",
		fmt.Sprintf("container %s is refused its GPUs and holds %d slot(s) of this node until the pod is deleted (by the agent %s after the first refusal): %v",
			container, slots, a.refusedGrace(), err))
	a.event(ctx, v1.EventTypeWarning, "GPUSlotsHeld",
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

func (a *Agent) refusedGrace() time.Duration {
	if a.opts.RefusedGrace > 0 {
		return a.opts.RefusedGrace
	}
	return DefaultRefusedGrace
}

func (a *Agent) now() time.Time {
	if a.opts.Now != nil {
		return a.opts.Now()
	}
	return time.Now()
}

// pruneRefused forgets refused pods that left the node (their slots with
// them), and deletes those still there past the grace: kubelet frees a
// pod's slots only when it ends, and a pod refused its GPUs never starts.
func (a *Agent) pruneRefused(ctx context.Context) {
	a.forgetDeparted(ctx)
	a.refusedMu.Lock()
	due := overdue(a.refused, a.now(), a.refusedGrace())
	var pods []refusedPod
	for _, uid := range due {
		pods = append(pods, *a.refused[uid])
	}
	a.refusedMu.Unlock()
	for i, r := range pods {
		a.releaseRefused(ctx, due[i], r)
	}
}

// releaseRefused deletes a pod refused its GPUs for longer than the grace,
// the pod with that UID only (a new pod of the same name is not touched).
func (a *Agent) releaseRefused(ctx context.Context, uid types.UID, r refusedPod) {
	logger := klog.FromContext(ctx)
	held := 0
	for _, n := range r.slots {
		held += n
	}
	forget := func() {
		a.refusedMu.Lock()
		delete(a.refused, uid)
		total := a.refusedTotalLocked()
		a.refusedMu.Unlock()
		a.m.refusedSlots.WithLabelValues(a.opts.Node).Set(float64(total))
	}
	err := a.opts.Client.CoreV1().Pods(r.namespace).Delete(ctx, r.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		forget() // gone already, or the name is another pod's now
		return
	case err != nil:
		logger.Error(err, "Could not delete a pod refused its GPUs; its slots stay held", "pod", klog.KRef(r.namespace, r.name))
		return
	}
	logger.Info("Deleted a pod refused its GPUs past the grace; its slots are free", "pod", klog.KRef(r.namespace, r.name), "slots", held, "grace", a.refusedGrace())
	msg := fmt.Sprintf("pod %s/%s was refused its GPUs for %s, holding %d slot(s): deleted to free them", r.namespace, r.name, a.refusedGrace(), held)
	a.eventOn(ctx, podRef(r.namespace, r.name, uid), v1.EventTypeWarning, "GPUSlotsReleased", msg)
	a.event(ctx, v1.EventTypeWarning, "GPUSlotsReleased", msg)
	forget()
}

// forgetDeparted forgets refused pods that left the node.
func (a *Agent) forgetDeparted(ctx context.Context) {
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
	a.m.refusedSlots.WithLabelValues(a.opts.Node).Set(float64(total))
}
