package scheduler

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
)

// Filter says whether the pod's GPUs fit the node. It runs once per node
// per pod: the cache's memoized fit, kubelet's slot count where the
// allocator finds room, and, where it does not, whether the cache may be
// behind the cycle's snapshot (asked until one node says so).
func (p *Plugin) Filter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := readState(state)
	if s == nil && readClaims(state) != nil {
		return p.filterClaims(ctx, state, pod, nodeInfo)
	}
	if st := p.filterGPU(ctx, s, pod, nodeInfo); st != nil || !s.claims {
		return st
	}
	return p.filterClaims(ctx, state, pod, nodeInfo)
}

// filterClaims is Filter for the pod's claims: what preemptors nominated
// to the node hold (claimpreempt.go), then upstream's allocator.
func (p *Plugin) filterClaims(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	c, node := readClaims(state), nodeInfo.Node().Name
	if st := heldForNominated(c, node); st != nil {
		return st
	}
	return preemptible(c, node, p.claims.inner.Filter(ctx, state, pod, nodeInfo))
}

// filterGPU is Filter for the pod's device-plugin GPUs.
func (p *Plugin) filterGPU(ctx context.Context, s *stateData, pod *v1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	if s == nil {
		// PreFilter writes the state of every pod it does not skip, and
		// the framework runs no Filter after a Skip: a missing state is a
		// bug, not a node that fits.
		return fwk.AsStatus(errNoCycleState)
	}
	if s.timed {
		defer observeSince(filterDuration, time.Now())
	}
	name := nodeInfo.Node().Name
	var reason allocator.Reason
	var err error
	allocatableSlots := int64(-1)
	if len(s.nominated[name]) > 0 {
		var ok bool
		if reason, ok = p.fitWithNominated(s, name); !ok {
			err = cache.ErrNoInventory
		}
	} else {
		reason, allocatableSlots, err = p.cache.FitNode(s.alloc, nodeInfo.Node(), s.shape, s.req)
	}
	if err != nil {
		rejectedNoInventory.Inc()
		s.rejected.add("NoInventory")
		if _, unreadable := p.unreadable.Load(name); !unreadable {
			p.noteBehind(s.rejected, nodeInfo, true)
		}
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, p.noInventoryReason(name))
	}
	if !reason.OK() {
		rejectedNodes[reason.Code].Inc()
		s.rejected.addReason(name, reason)
		p.noteBehind(s.rejected, nodeInfo, !reason.Code.FromInventory())
		// The message is the code's, the same on every node (the
		// framework counts identical ones); this node's numbers go to the
		// log, and the cluster's to PostFilter's line.
		if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
			logger.Info("GPU pod does not fit the node", "pod", klog.KObj(pod), "node", name, "reason", reason.String())
		}
		// A refusal that follows from the node's GPUs alone (their health,
		// models, modes, kernel limits) no eviction can lift: preemption
		// skips such nodes, as it skips those other plugins mark so.
		code := fwk.Unschedulable
		if reason.Code.FromInventory() {
			code = fwk.UnschedulableAndUnresolvable
		}
		return fwk.NewStatus(code, reason.Code.Message())
	}
	// Only where the allocator finds room: a node it refuses needs no
	// second look.
	if st := slotsFit(s.slots, nodeInfo, allocatableSlots); st != nil {
		s.rejected.add("InsufficientSlots")
		return st
	}
	return nil
}

// noteBehind marks the cycle's rejections when the cache may not yet have
// applied a change the scheduler's snapshot of the node shows (see
// Cache.Behind): the pod then waits for the handler's activation, since the
// queue's hints fired before the cache caught up.
func (p *Plugin) noteBehind(r *rejections, nodeInfo fwk.NodeInfo, bookings bool) {
	if r == nil || r.behind.Load() {
		return
	}
	if p.cache.Behind(nodeInfo, bookings) {
		r.behind.Store(true)
	}
}

// reasonInsufficientSlots is the Filter reason when kubelet has too few
// device-plugin slots left on a node: the reason NodeResourcesFit gives.
const reasonInsufficientSlots = "Insufficient " + gpu.ResourceGPU

// slotsFit checks the node's device-plugin slots as kubelet counts them:
// the pods bound there take theirs until they are deleted, those the agent
// refused their GPUs included, so a GPU with room in the allocator's
// account is no place for a pod kubelet would reject ("UnexpectedAdmission
// Error … Available: 0"). allocatable is the node's slots where the cache
// read them from the same object (FitNode), -1 where it did not.
func slotsFit(want int64, nodeInfo fwk.NodeInfo, allocatable int64) *fwk.Status {
	if want == 0 {
		return nil
	}
	if allocatable < 0 {
		allocatable = nodeInfo.GetAllocatable().GetScalarResources()[gpu.ResourceGPU]
	}
	free := allocatable - nodeInfo.GetRequested().GetScalarResources()[gpu.ResourceGPU]
	if want > free {
		rejectedSlots.Inc()
		return fwk.NewStatus(fwk.Unschedulable, reasonInsufficientSlots)
	}
	return nil
}

// noInventoryReason says why a node takes no GPU pod: its inventory is
// missing, or there but unreadable (and why).
func (p *Plugin) noInventoryReason(node string) string {
	if _, ok := p.unreadable.Load(node); ok {
		// Why is in the node's InvalidGPUInventory event: per node, it
		// would make the framework's count one clause per node.
		return fmt.Sprintf("node's GPU inventory (annotation %s) is unreadable (see the node's InvalidGPUInventory event); its tessera-agent republishes it when it runs there",
			gpu.AnnotationInventory)
	}
	return fmt.Sprintf("node has no Tessera GPU inventory (annotation %s); is tessera-agent running there?", gpu.AnnotationInventory)
}
