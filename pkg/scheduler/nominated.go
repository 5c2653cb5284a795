package scheduler

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// PreFilterExtensions returns the plugin: the framework adds the pods
// nominated to a node (preemptors waiting for their victims to leave) before
// it filters a pod of lower or equal priority there, so the slices a
// preemption freed are kept for its preemptor.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// AddPod counts a nominated GPU pod as placed on its node for the rest of
// this filter evaluation.
func (p *Plugin) AddPod(_ context.Context, state fwk.CycleState, _ *v1.Pod, podInfo fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	s := readState(state)
	q := podInfo.GetPod()
	if c := readClaims(state); c != nil {
		p.addNominatedClaimPod(c, q, nodeInfo.Node().Name)
	}
	if s == nil || !podgpu.WantsGPU(q) || q.Spec.NodeName != "" {
		// A bound pod is already in the cache's view of the node.
		return nil
	}
	r, err := p.request(q)
	if err != nil {
		return nil
	}
	name := nodeInfo.Node().Name
	if s.nominated == nil {
		s.nominated = map[string][]nominatedPod{}
	}
	s.nominated[name] = append(s.nominated[name], nominatedPod{uid: string(q.UID), req: r})
	return nil
}

// RemovePod undoes AddPod for a nominated pod.
func (p *Plugin) RemovePod(_ context.Context, state fwk.CycleState, _ *v1.Pod, podInfo fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	name, uid := nodeInfo.Node().Name, string(podInfo.GetPod().UID)
	if s := readState(state); s != nil && s.nominated != nil {
		s.nominated[name] = withoutNominated(s.nominated[name], uid)
	}
	if c := readClaims(state); c != nil && c.nominated != nil {
		c.nominated[name] = withoutNominated(c.nominated[name], uid)
	}
	return nil
}

func withoutNominated(list []nominatedPod, uid string) []nominatedPod {
	for i := range list {
		if list[i].uid == uid {
			return append(list[:i:i], list[i+1:]...)
		}
	}
	return list
}

// nominatedPod is a preemptor waiting for a node.
type nominatedPod struct {
	uid string
	req *allocator.Request
}

// fitWithNominated places the node's nominated pods first, then r.
func (p *Plugin) fitWithNominated(s *stateData, name string) (allocator.Reason, bool) {
	defer observe("FilterNominated", time.Now())
	n := p.cache.Snapshot(name)
	if n == nil {
		return allocator.Reason{}, false
	}
	var pl allocator.Placement
	for _, np := range s.nominated[name] {
		if s.alloc.Place(n, np.req, &pl).OK() {
			n.Apply(np.req, &pl)
		}
	}
	return s.alloc.Place(n, s.req, &pl), true
}
