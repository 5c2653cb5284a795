package scheduler

import (
	"context"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Preemption for pods whose gpu.tessera.dev claims fit no node: the same
// plan (planPreemption) and the same three levels as for device-plugin
// pods, over a view of the DRA nodes in which each claim holder is a
// bound pod whose assignment is what its claims consumed. Upstream's
// DynamicResources cannot preempt claim holders in Kubernetes 1.37.
//
// A victim's capacity comes back when its claims are deallocated (the
// built-in claim controller does so once the pod is gone), and until the
// preemptor is placed it is held for it: Filter counts the claim pods
// nominated to a node, of at least the filtered pod's priority, as placed
// there (AddPod), so a pod of lower priority does not take what was freed.

// claimHolders is the DRA node's base with every allocated claim counted
// on it, and the pods that hold claims there alone, each with its claims'
// grants as one assignment. A claim no pod holds any more is being
// deallocated: it is not counted. A claim several pods share stays
// counted, its pods no candidates: evicting one frees nothing.
func claimHolders(node string, base *allocator.Node, claims []*resourceapi.ResourceClaim, podOf func(namespace, name string, uid types.UID) *v1.Pod) (*allocator.Node, []boundPod) {
	usage := base.Clone()
	nodes := map[string]*allocator.Node{node: usage}
	byPod := map[types.UID]*boundPod{}
	var order []types.UID
	for _, claim := range claims {
		grants := claimGrants(nodes, claim)[node]
		if len(grants) == 0 {
			continue
		}
		var holders []resourceapi.ResourceClaimConsumerReference
		for _, r := range claim.Status.ReservedFor {
			if r.APIGroup == "" && r.Resource == "pods" {
				holders = append(holders, r)
			}
		}
		if len(holders) == 0 {
			continue
		}
		a := &gpu.PodAssignment{Node: node}
		for _, g := range grants {
			a.Containers = append(a.Containers, gpu.ContainerAssignment{Name: "claim " + claim.Name, Mode: g.mode, GPUs: []gpu.GPUGrant{g.grant}})
		}
		usage.ForceAssignment(a, 0, 0)
		if len(holders) > 1 {
			continue
		}
		pod := podOf(claim.Namespace, holders[0].Name, holders[0].UID)
		if pod == nil {
			continue
		}
		b, ok := byPod[pod.UID]
		if !ok {
			b = &boundPod{pod: pod, assignment: &gpu.PodAssignment{Node: node}}
			byPod[pod.UID] = b
			order = append(order, pod.UID)
		}
		b.assignment.Containers = append(b.assignment.Containers, a.Containers...)
	}
	bound := make([]boundPod, 0, len(order))
	for _, uid := range order {
		bound = append(bound, *byPod[uid])
	}
	return usage, bound
}

// preemptForClaims is PostFilter's preemption for a pod whose
// gpu.tessera.dev claim fit no DRA node.
func (p *Plugin) preemptForClaims(ctx context.Context, c *claimCycle, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	logger := klog.FromContext(ctx).WithValues("preemptor", klog.KObj(pod))
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever {
		return nil, fwk.NewStatus(fwk.Unschedulable, "not preempting: the pod's preemptionPolicy is Never")
	}
	claims, err := p.claims.claims.List()
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	pods, err := p.pods.List(labels.Everything())
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	pdbs, err := p.pdbs.List(labels.Everything())
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	podOf := func(namespace, name string, uid types.UID) *v1.Pod {
		q, err := p.pods.Pods(namespace).Get(name)
		if err != nil || q.UID != uid || q.Spec.NodeName == "" {
			return nil
		}
		return q
	}
	view := &preemptionView{now: time.Now(), pdbs: pdbs}
	names := make([]string, 0, len(c.bases))
	for name := range c.bases {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if st := statuses.Get(name); st == nil || st.Code() != fwk.Unschedulable || st.Plugin() != Name {
			continue
		}
		usage, bound := claimHolders(name, c.bases[name], claims, podOf)
		nv := nodeView{name: name, usage: usage, bound: bound}
		for _, q := range pods {
			if q.Spec.NodeName != "" || q.Status.NominatedNodeName != name || q.UID == pod.UID {
				continue
			}
			np := nominatedPreemptor{pod: q}
			if corev1helpers.PodPriority(q) >= corev1helpers.PodPriority(pod) {
				np.req = p.claims.request(q)
			}
			nv.nominated = append(nv.nominated, np)
		}
		view.nodes = append(view.nodes, nv)
	}
	best := planPreemption(c.alloc, p.cache.Oversubscription(), pod, c.req, view)
	if best == nil {
		preemptions.WithLabelValues("impossible").Inc()
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption cannot make room: no DRA node fits the pod's gpu.tessera.dev claim even without every lower-priority claim holder it may evict")
	}
	return p.carryOut(ctx, logger, pod, best, view.now, "Preempting claim holders")
}

// addNominatedClaimPod counts a nominated claim pod's request on its node
// for the rest of this filter evaluation (AddPod).
func (p *Plugin) addNominatedClaimPod(c *claimCycle, q *v1.Pod, node string) {
	if q.Spec.NodeName != "" || !p.claims.wants(q) {
		return
	}
	r := p.claims.request(q)
	if r == nil {
		return
	}
	if c.nominated == nil {
		c.nominated = map[string][]nominatedPod{}
	}
	c.nominated[node] = append(c.nominated[node], nominatedPod{uid: string(q.UID), req: r})
}

// reasonNoDevices is upstream's Filter reason where the allocator finds no
// devices for the pod's claims on a node.
const reasonNoDevices = "cannot allocate all claims"

// preemptible makes upstream's verdict that a DRA node has no devices for
// the pod's claims one preemption may lift (Unschedulable, not
// UnschedulableAndUnresolvable: upstream cannot preempt claim holders, so
// it says no eviction helps) where the pod has a gpu.tessera.dev request
// and the node is one of the ranked DRA nodes; the plan then checks the
// request fits there without the victims.
func preemptible(c *claimCycle, node string, st *fwk.Status) *fwk.Status {
	if st.Code() != fwk.UnschedulableAndUnresolvable || c == nil || c.req == nil || c.bases[node] == nil || st.Message() != reasonNoDevices {
		return st
	}
	return fwk.NewStatus(fwk.Unschedulable, reasonNoDevices)
}

// heldForNominated refuses the node when the claim pods nominated there
// (preemptors whose victims' claims were deallocated), placed first, leave
// the pod's claim no GPU by the scheduler's account.
func heldForNominated(c *claimCycle, node string) *fwk.Status {
	if c == nil {
		return nil
	}
	nominated := c.nominated[node]
	view := c.views[node]
	if len(nominated) == 0 || view == nil || c.req == nil {
		return nil
	}
	n := view.Clone()
	var pl allocator.Placement
	held := false
	for _, np := range nominated {
		if c.alloc.Place(n, np.req, &pl).OK() {
			n.Apply(np.req, &pl)
			held = true
		}
	}
	if held && !c.alloc.Place(n, c.req, &pl).OK() {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("the GPUs %s freed are held for a preemptor nominated there", node))
	}
	return nil
}
