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
// worth visiting (candidates).
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	defer observe("PreFilter", time.Now())
	if !podgpu.WantsGPU(pod) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if err := p.waitForSync(ctx); err != nil {
		return nil, fwk.AsStatus(err)
	}
	freedAt := p.cache.Freed()
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
	if cands := p.cache.Candidates(s.alloc, s.shape, req); cands.nodes != nil && cands.known >= len(nodes) &&
		narrowsSearch(cands.nodes.Len(), len(nodes), p.percentageOfNodesToScore()) {
		s.excluded = cands.excluded
		return &fwk.PreFilterResult{NodeNames: cands.nodes}, nil
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
