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
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// PreFilter parses and validates the pod's GPU request, and names the nodes
// worth visiting (candidates); for a pod with ResourceClaims it prepares
// their allocation (claims.go).
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	defer observe("PreFilter", time.Now())
	res, st := p.preFilterGPU(ctx, state, pod, nodes)
	if !p.claims.wants(pod) || !(st.IsSuccess() || st.IsSkip()) {
		return res, st
	}
	if err := p.waitForSync(ctx); err != nil {
		return nil, fwk.AsStatus(err)
	}
	alloc := p.workload.Current()
	if s := readState(state); s != nil && !st.IsSkip() {
		alloc = s.alloc
	}
	claimRes, claimSt := p.claims.preFilter(ctx, state, pod, nodes, alloc, p.cache.Snapshot, p.cache.Oversubscription())
	switch {
	case claimSt.IsSkip():
		return res, st
	case !claimSt.IsSuccess():
		return claimRes, claimSt
	case st.IsSkip():
		return claimRes, nil
	}
	readState(state).claims = true
	return res.Merge(claimRes), nil
}

// preFilterGPU is PreFilter for the pod's device-plugin GPUs.
func (p *Plugin) preFilterGPU(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if !podgpu.WantsGPU(pod) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if err := p.waitForSync(ctx); err != nil {
		return nil, fwk.AsStatus(err)
	}
	freedAt := p.cache.RoomChanges()
	req, err := p.request(pod)
	if err != nil {
		rejectedInvalid.Inc()
		p.pending.set(pod, "InvalidRequest")
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, err.Error())
	}
	// A pod asking more GPUs than any node has fits nowhere: said once here,
	// not once per node by Filter, and left waiting by the pod-deletion hint
	// until a node with more GPUs joins.
	if most := p.cache.MostGPUs(); most > 0 && req.GPUs() > most {
		rejectedTooManyGPUs.Inc()
		p.pending.set(pod, "TooManyGPUs")
		p.waitIfBehind(ctx, pod, nodes, freedAt)
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf(
			"the pod asks for %d GPUs on one node, but the node with the most GPUs has %d; it waits until a node with more joins (or ask for fewer)", req.GPUs(), most))
	}
	s := &stateData{req: req, slots: podgpu.Slots(pod), shape: p.cache.Shape(req.Key()), alloc: p.workload.Current(), rejected: &rejections{}, freedAt: freedAt,
		timed: p.cycles.Add(1)%timedCycleEvery == 1}
	state.Write(stateKey, s)
	// Only the nodes that could ever hold the pod are visited, unless the
	// scheduler's snapshot has nodes the cache has not seen yet, or fewer
	// candidates would make the framework look further (narrowsSearch).
	if cands := p.cache.Candidates(s.alloc, s.shape, req); cands.Nodes != nil && cands.Known >= len(nodes) &&
		narrowsSearch(cands.Nodes.Len(), len(nodes), p.percentageOfNodesToScore()) {
		s.excluded = cands.Excluded
		return &fwk.PreFilterResult{NodeNames: cands.Nodes}, nil
	}
	return nil, nil
}

// percentageOfNodesToScore is the profile's setting, when the handle is the
// framework's own (nil: not set, or not visible).
func (p *Plugin) percentageOfNodesToScore() *int32 {
	if h, ok := p.handle.(interface{ PercentageOfNodesToScore() *int32 }); ok {
		return h.PercentageOfNodesToScore()
	}
	return nil
}

// waitIfBehind keeps a pod refused on the cache's view of the whole cluster
// among the waiters when the scheduler's snapshot shows a node whose
// inventory the cache has not applied yet: the node event's hint requeued
// the pod ahead of the handler, and no other event may come to wake it.
func (p *Plugin) waitIfBehind(ctx context.Context, pod *v1.Pod, nodes []fwk.NodeInfo, freedAt uint64) {
	unreadable := func(name string) bool { _, ok := p.unreadable.Load(name); return ok }
	if p.cache.InventoryBehind(nodes, unreadable) {
		p.waiting.add(p.cache, p.queue, pod, freedAt, klog.FromContext(ctx))
	}
}

// request reads a pod's request (podgpu.Request) and checks it against the cluster: a slice
// larger than every GPU known would wait forever.
func (p *Plugin) request(pod *v1.Pod) (*allocator.Request, error) {
	req, err := podgpu.Request(pod, p.cfg.MinSliceMiB)
	if err != nil {
		return nil, fmt.Errorf("invalid GPU request: %w", err)
	}
	if err := preemption.ValidateAnnotations(pod); err != nil {
		return nil, fmt.Errorf("invalid preemption settings: %w", err)
	}
	if largest := p.cache.MaxGPUMemoryMiB(); largest > 0 {
		for _, c := range req.Containers {
			if c.MemoryMiB > largest {
				return nil, fmt.Errorf("invalid GPU request: container %s asks for %s=%d MiB per GPU, but the largest GPU in the cluster has %d MiB",
					c.Name, gpu.ResourceMemory, c.MemoryMiB, largest)
			}
		}
	}
	return req, nil
}

// narrowsSearch reports whether handing the framework candidates of the
// cluster's all nodes leaves it less to do. Its adaptive
// percentageOfNodesToScore (the default) stops filtering after a share of
// the nodes it was given that shrinks as that number grows, so a smaller set
// can raise how many nodes must pass and be scored: at 5,000 nodes, half of
// them as candidates means 750 to find instead of 500, and the rejected half
// cost less to visit than the extra 250 to score. This is the framework's
// count (schedule_one.go, numFeasibleNodesToFind) with the profile's
// percentage where the plugin can see it; a percentage set only globally is
// not visible here, and the default is assumed.
func narrowsSearch(candidates, all int, percentage *int32) bool {
	return feasibleToFind(candidates, percentage) <= feasibleToFind(all, percentage)
}

func feasibleToFind(nodes int, percentage *int32) int {
	const minNodes, minPercentage = 100, 5
	if nodes < minNodes {
		return nodes
	}
	pct := 0
	if percentage != nil {
		pct = int(*percentage)
	}
	if pct == 0 {
		pct = max(50-nodes/125, minPercentage)
	}
	return max(nodes*pct/100, minNodes)
}
