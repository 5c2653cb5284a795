package scheduler

import (
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
)

// Informer handlers: they keep the cache in step with the API server's pods
// and nodes, once per event (the hints only look; see hints.go).

// onPod keeps the cache in step with a pod: a bound pod's assignment is
// booked (or confirmed), a finished one released. New GPU pods also feed the
// workload the fgd and tessera policies score against.
func (p *Plugin) onPod(logger klog.Logger, obj any, added bool) {
	pod, ok := obj.(*v1.Pod)
	if !ok || !podgpu.WantsGPU(pod) {
		return
	}
	if podgpu.Finished(pod) {
		p.release(pod)
		p.waiting.forget(pod.UID)
		p.reportOrphans(logger)
		p.waiting.wake(p.cache, logger)
		return
	}
	if added {
		if req, err := p.request(pod); err == nil {
			p.workload.Observe(req)
		}
	}
	if pod.Spec.NodeName == "" {
		return
	}
	p.waiting.forget(pod.UID)
	a, err := podgpu.BoundAssignment(pod)
	switch {
	case err != nil:
		assignmentErrors.Inc()
		p.warnOnce(logger, pod, "InvalidGPUAssignment", err.Error())
		return
	case a == nil:
		p.warnOnce(logger, pod, "NoGPUAssignment",
			fmt.Sprintf("pod is bound to %s without a %s annotation: it was not placed by the %s plugin, so its GPUs are not accounted", pod.Spec.NodeName, gpu.AnnotationAssignment, Name))
		return
	}
	switch err := p.cache.AddBound(pod.UID, podKey(pod), a); {
	case errors.Is(err, cache.ErrAssignmentChanged):
		assignmentChanges.Inc()
		p.warnOnce(logger, pod, "GPUAssignmentChanged", err.Error())
	case err != nil:
		assignmentErrors.Inc()
		p.warnOnce(logger, pod, "InvalidGPUAssignment", err.Error())
	}
	if !p.cache.HasNode(a.Node) {
		p.reportOrphans(logger)
	}
}

func (p *Plugin) onPodDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*v1.Pod); ok {
		p.release(pod)
		p.waiting.forget(pod.UID)
		p.reportOrphans(klog.Background())
		p.waiting.wake(p.cache, klog.Background())
		prefix := string(pod.UID) + "/"
		p.warned.Range(func(k, _ any) bool {
			if s := k.(string); len(s) > len(prefix) && s[:len(prefix)] == prefix {
				p.warned.Delete(k)
			}
			return true
		})
	}
}

// release tells the cache a pod left the API server or finished; a
// preemption victim's slices stay booked, for its preemptor, until its
// agent confirms them clean.
func (p *Plugin) release(pod *v1.Pod) {
	if !preemption.IsVictim(pod) {
		p.cache.Gone(pod.UID, false)
		return
	}
	var preemptor types.UID
	if n, err := preemption.NoticeOf(pod); err == nil && n != nil {
		preemptor = types.UID(n.PreemptorUID)
	}
	p.cache.GoneVictimOf(pod.UID, preemptor)
}

// onNode installs, replaces or drops a node's inventory, then wakes the
// pods that waited on a cache behind the scheduler's.
func (p *Plugin) onNode(logger klog.Logger, obj any) {
	p.applyNode(logger, obj)
	p.waiting.wake(p.cache, logger)
}

func (p *Plugin) applyNode(logger klog.Logger, obj any) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	if _, has := node.Annotations[gpu.AnnotationInventory]; !has {
		p.unreadable.Delete(node.Name)
		p.cache.SetBare(node.Name, true)
		if p.cache.HasNode(node.Name) {
			p.cache.RemoveNode(node.Name)
			p.reportOrphans(logger)
		}
		return
	}
	if p.cache.SameInventory(node) {
		return // a status or label update: nothing of Tessera's changed
	}
	// A GPU node's error count is exported from its first inventory on, at
	// 0, so that a later error is an increase TesseraInventoryErrors sees
	// (the rule also catches a count born at its first error).
	errs := inventoryErrors.WithLabelValues(node.Name)
	inv, err := inventory.FromNode(node)
	if err == nil {
		var overfull []string
		overfull, err = p.cache.SetNodeFrom(node, inv)
		if err == nil {
			p.unreadable.Delete(node.Name)
			if len(overfull) > 0 {
				logger.Error(nil, "Pods' GPU assignments no longer fit their node's inventory; their GPUs stay booked, over-full, until they leave", "node", node.Name, "pods", overfull)
			}
			p.reportOrphans(logger)
			return
		}
	}
	errs.Inc()
	p.unreadable.Store(node.Name, err.Error())
	p.warnOnce(logger, node, "InvalidGPUInventory", err.Error())
	p.cache.SetBare(node.Name, true)
	p.cache.RemoveNode(node.Name)
	p.reportOrphans(logger)
}

func (p *Plugin) onNodeDelete(logger klog.Logger, obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if node, ok := obj.(*v1.Node); ok {
		p.unreadable.Delete(node.Name)
		p.cache.SetBare(node.Name, false)
		p.cache.RemoveNode(node.Name)
		p.reportOrphans(logger)
	}
}

// reportOrphans publishes the number of bound pods whose GPUs are counted on
// no node, and logs them: they are invisible to placement until their node's
// inventory returns, which an operator must know.
// It is called whenever the set may have changed (a pod gone too), and logs
// only when the set did change.
func (p *Plugin) reportOrphans(logger klog.Logger) {
	o := p.cache.Orphans()
	orphanedPods.Set(float64(len(o)))
	key := strings.Join(o, ",")
	if prev, _ := p.lastOrphans.Swap(key).(string); prev != key && len(o) > 0 {
		logger.Info("Bound GPU pods are on nodes without a usable GPU inventory", "count", len(o), "pods", o)
	}
}

// warnOnce logs and records a Warning event on obj once per object and reason.
func (p *Plugin) warnOnce(logger klog.Logger, obj runtime.Object, reason, msg string) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	key := string(m.GetUID()) + "/" + reason + "/" + msg
	if _, seen := p.warned.LoadOrStore(key, true); seen {
		return
	}
	logger.Error(nil, msg, "object", klog.KObj(m), "reason", reason)
	if p.handle == nil {
		return
	}
	if r := p.handle.EventRecorder(); r != nil {
		r.Eventf(obj, nil, v1.EventTypeWarning, reason, "Scheduling", "%s", msg)
	}
}
