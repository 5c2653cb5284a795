package scheduler

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
)

// EventsToRegister names the events that can make a pod this plugin rejected
// fit: a GPU pod leaving (its slices free up; a pod that finishes counts, as
// the scheduler's pod informer drops terminal pods) and a node's inventory
// changing (a GPU added or healthy again, a node joining).
//
// The hints only look at the event: the framework calls a hint once per
// waiting pod, so work done there is done that many times per event. The
// cache is changed once, by this plugin's informer handlers. Those run on
// their own goroutine, apart from the scheduler's queue: a pod the hint
// requeued can be tried before the handler applied the event, and fail on
// the cache as it was. Filter notices (Cache.Behind) and PostFilter keeps
// such a pod among the waiters, which the handler activates once it has
// applied a change that made room — without that, the pod sat out the
// five-minute unschedulable flush with no further event to wake it.
func (p *Plugin) EventsToRegister(ctx context.Context) ([]fwk.ClusterEventWithHint, error) {
	events := []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, QueueingHintFn: p.hintGPUPodGone},
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAnnotation | fwk.UpdateNodeAllocatable}, QueueingHintFn: p.hintInventoryChanged},
	}
	if p.claims == nil {
		return events, nil
	}
	// Claims, their slices and classes: upstream's events and hints.
	claims, err := p.claims.inner.EventsToRegister(ctx)
	return append(events, claims...), err
}

// hintGPUPodGone requeues on the deletion of a pod that held GPUs or
// device-plugin slots (one the agent refused holds slots without an
// assignment), unless the waiting pod asks more GPUs than any node has: no
// deletion makes a node larger (PreFilter refused it for that). The deleted
// pod is looked at first: it is the same for every waiting pod the event is
// asked about, so its fields stay in the CPU's cache, where each waiting
// pod's own request is a fresh read, for every waiting pod at each
// deletion.
func (p *Plugin) hintGPUPodGone(_ klog.Logger, waiting *v1.Pod, oldObj, _ any) (fwk.QueueingHint, error) {
	if pod, ok := oldObj.(*v1.Pod); ok {
		if _, has := pod.Annotations[gpu.AnnotationAssignment]; !has && podgpu.Slots(pod) == 0 {
			return fwk.QueueSkip, nil
		}
	}
	if most := p.cache.MostGPUs(); most > 0 && podgpu.Slots(waiting) > int64(most) {
		return fwk.QueueSkip, nil
	}
	return fwk.Queue, nil
}

// hintInventoryChanged requeues when a node's inventory or its device-plugin
// slots (allocatable tessera.dev/gpu) change.
func (p *Plugin) hintInventoryChanged(_ klog.Logger, _ *v1.Pod, oldObj, newObj any) (fwk.QueueingHint, error) {
	n, ok := newObj.(*v1.Node)
	if !ok {
		return fwk.Queue, nil
	}
	now, has := n.Annotations[gpu.AnnotationInventory]
	if !has {
		return fwk.QueueSkip, nil
	}
	old, ok := oldObj.(*v1.Node)
	if !ok || old.Annotations[gpu.AnnotationInventory] != now {
		return fwk.Queue, nil
	}
	if !old.Status.Allocatable.Name(gpu.ResourceGPU, resource.DecimalSI).Equal(*n.Status.Allocatable.Name(gpu.ResourceGPU, resource.DecimalSI)) {
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

// waiters are the pods whose last cycle may have been judged on a cache
// behind the scheduler's snapshot (see EventsToRegister), until the cache
// next makes room and they are activated. Only such pods are kept: activating
// every waiting pod on every change would retry them ahead of their backoff.
type waiters struct {
	mu   sync.Mutex
	pods map[types.UID]waiter
}

type waiter struct {
	pod   *v1.Pod
	queue fwk.PodActivator
	// began is Cache.Freed when the pod's cycle began.
	began uint64
}

// add keeps a pod whose cycle, begun at the cache's Freed count began, found
// the cache behind. When room was made since the cycle began, the pod is
// activated at once instead: it is still in flight, and the queue retries it
// as soon as it returns.
func (w *waiters) add(c *cache.Cache, queue fwk.PodActivator, pod *v1.Pod, began uint64, logger klog.Logger) {
	if queue == nil {
		return
	}
	w.mu.Lock()
	if c.RoomChanges() == began {
		if w.pods == nil {
			w.pods = map[types.UID]waiter{}
		}
		w.pods[pod.UID] = waiter{pod: pod, queue: queue, began: began}
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	logger.V(4).Info("Room was made while the pod was tried; trying again", "pod", klog.KObj(pod))
	queue.Activate(logger, map[string]*v1.Pod{podKey(pod): pod})
}

// forget drops a pod that was placed or left.
func (w *waiters) forget(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.pods, uid)
}

// wake activates the waiters whose cycle began before the cache last made
// room. It is called after every change the handlers apply.
func (w *waiters) wake(c *cache.Cache, logger klog.Logger) {
	w.mu.Lock()
	if len(w.pods) == 0 {
		w.mu.Unlock()
		return
	}
	freed := c.RoomChanges()
	byQueue := map[fwk.PodActivator]map[string]*v1.Pod{}
	for uid, x := range w.pods {
		if x.began == freed {
			continue
		}
		if byQueue[x.queue] == nil {
			byQueue[x.queue] = map[string]*v1.Pod{}
		}
		byQueue[x.queue][podKey(x.pod)] = x.pod
		delete(w.pods, uid)
	}
	w.mu.Unlock()
	for queue, pods := range byQueue {
		logger.V(4).Info("Trying pods again that were judged on a cache behind the scheduler's", "pods", len(pods))
		queue.Activate(logger, pods)
	}
}
