package scheduler

// Victim selection: a pure function of one snapshot of the cluster (the
// pods, budgets and GPU bookings PostFilter gathers) that returns a plan —
// the node and its victims — or says why there is none. It does no I/O;
// PostFilter gathers the view and hands the plan to the notice sender.

import (
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
)

// preemptionView is what victim selection reads: the cluster as the
// scheduler's informers and GPU cache hold it at one moment.
type preemptionView struct {
	now  time.Time
	pdbs []*policyv1.PodDisruptionBudget
	// nodes are those where the GPUs were what failed, in name order.
	nodes []nodeView
}

// nodeView is one node in a preemptionView.
type nodeView struct {
	name string
	// usage is the cache's bookings on the node; the plan works on a copy.
	usage *allocator.Node
	// bound are the pods running there, with the assignment the cache
	// books for them (nil: not booked).
	bound []boundPod
	// nominated are the pods nominated there (preemptors waiting for their
	// victims to leave), with their requests (nil: malformed).
	nominated []nominatedPreemptor
	// reclaiming are the victims gone from the API server whose slices
	// still await the agent's reclaim.
	reclaiming []cache.ReclaimingVictim
}

type boundPod struct {
	pod        *v1.Pod
	assignment *gpu.PodAssignment
}

type nominatedPreemptor struct {
	pod *v1.Pod
	req *allocator.Request
}

// mayPreempt says whether any running GPU pod could make way for preemptor:
// one of lower priority, or its own victim already. A cluster full of pods
// of the preemptor's priority or higher (a batch queue at one priority) is
// the common case, answered without looking at any node.
func mayPreempt(preemptor *v1.Pod, pods []*v1.Pod) bool {
	prio := corev1helpers.PodPriority(preemptor)
	for _, q := range pods {
		if q.Spec.NodeName == "" || !podgpu.WantsGPU(q) {
			continue
		}
		if n, _ := preemption.NoticeOf(q); n != nil {
			if n.PreemptorUID == string(preemptor.UID) {
				return true
			}
		} else if corev1helpers.PodPriority(q) < prio {
			return true
		}
	}
	return false
}

// planPreemption chooses the node where evicting the fewest, lowest-priority
// GPU pods lets r (preemptor's request) fit, and those pods. Slices already
// on their way to preemptor or to a pod nominated ahead of it — victims
// notified and still running, or gone and awaiting reclaim — count as freed
// for their preemptor, so a second set of victims is never chosen while the
// first set's slices are released. It returns nil when no set of victims
// makes the pod fit; a plan with no victims means the pod's earlier victims
// are enough and it only waits for them.
func planPreemption(a *allocator.Allocator, oversub float64, preemptor *v1.Pod, r *allocator.Request, v *preemptionView) *nodeChoice {
	prio := corev1helpers.PodPriority(preemptor)
	var best *nodeChoice
	for _, nv := range v.nodes {
		base := nv.usage.Clone()
		// Pods nominated here with at least our priority are promised
		// their slices: their victims are as good as gone, and they count
		// as placed, highest priority first, then oldest: the order the
		// scheduling queue serves them.
		promised := map[types.UID]bool{}
		var promisedOrder []nominatedPreemptor
		for _, q := range nv.nominated {
			if q.pod.UID != preemptor.UID && corev1helpers.PodPriority(q.pod) >= prio {
				promised[q.pod.UID] = true
				promisedOrder = append(promisedOrder, q)
			}
		}
		sort.SliceStable(promisedOrder, func(i, j int) bool {
			pi, pj := corev1helpers.PodPriority(promisedOrder[i].pod), corev1helpers.PodPriority(promisedOrder[j].pod)
			if pi != pj {
				return pi > pj
			}
			return promisedOrder[i].pod.CreationTimestamp.Before(&promisedOrder[j].pod.CreationTimestamp)
		})
		freed := false
		for _, rv := range nv.reclaiming {
			if promised[rv.Preemptor] || rv.Preemptor == preemptor.UID {
				base.RemoveAssignment(rv.Assignment, 0, 0)
				freed = true
			}
		}
		var cands []candidate
		for _, b := range nv.bound {
			q := b.pod
			if b.assignment == nil || podgpu.Finished(q) {
				continue
			}
			if n, _ := preemption.NoticeOf(q); n != nil {
				// Already a victim: of ours (an earlier cycle) or of a
				// promised preemptor, it is going away; of a lower
				// preemptor, it stays as it is.
				if promised[types.UID(n.PreemptorUID)] || n.PreemptorUID == string(preemptor.UID) {
					base.RemoveAssignment(b.assignment, 0, 0)
					freed = true
				}
				continue
			}
			if corev1helpers.PodPriority(q) >= prio || q.DeletionTimestamp != nil || !disruptionAllowed(q, v.pdbs) {
				continue
			}
			started := q.CreationTimestamp.Time
			if q.Status.StartTime != nil {
				started = q.Status.StartTime.Time
			}
			cands = append(cands, candidate{pod: q, assignment: b.assignment, priority: corev1helpers.PodPriority(q),
				gpuSeconds: gpuShare(b.assignment) * v.now.Sub(started).Seconds()})
		}
		blocked := false
		for _, q := range promisedOrder {
			if q.req == nil {
				continue
			}
			var pl allocator.Placement
			if !a.Place(base, q.req, &pl).OK() {
				blocked = true // its victims are not enough yet; do not compete
				break
			}
			base.Apply(q.req, &pl)
		}
		if blocked || (len(cands) == 0 && !freed) {
			// Nothing would leave: Filter's verdict stands.
			continue
		}
		victims, ok := selectVictims(a, base, r, cands, oversub)
		if !ok || !withinBudgets(victims, v.pdbs) {
			continue
		}
		c := nodeChoice{node: nv.name, victims: victims}
		if best == nil || better(c, *best) {
			best = &c
		}
	}
	return best
}

// candidate is a running GPU pod that preemption may evict.
type candidate struct {
	pod        *v1.Pod
	assignment *gpu.PodAssignment
	priority   int32
	// gpuSeconds is what evicting it throws away: the share of GPUs it
	// holds times how long it has run. Of equal priorities, the victim
	// that disturbs the least GPU time goes first.
	gpuSeconds float64
}

// gpuShare is the number of GPUs an assignment holds, fractions counted by
// their share of the SMs.
func gpuShare(a *gpu.PodAssignment) float64 {
	s := 0.0
	for _, c := range a.Containers {
		for _, g := range c.GPUs {
			s += float64(g.CoresPerMille) / gpu.CoresPerGPU
		}
	}
	return s
}

// selectVictims finds, on one node, a set of candidates whose removal lets r
// fit: all of them out, then each put back — the most important first
// (highest priority, most GPU time) — whenever r still fits without it. The
// pods kept are kept because they matter most; the rest are the victims.
// It reports false when r does not fit even with every candidate gone: then
// no one is evicted.
func selectVictims(a *allocator.Allocator, base *allocator.Node, r *allocator.Request, cands []candidate, oversub float64) ([]candidate, bool) {
	n := base.Clone()
	for _, c := range cands {
		n.RemoveAssignment(c.assignment, 0, 0)
	}
	var p allocator.Placement
	if !a.Place(n, r, &p).OK() {
		return nil, false
	}
	order := append([]candidate(nil), cands...)
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].priority != order[j].priority {
			return order[i].priority > order[j].priority
		}
		return order[i].gpuSeconds > order[j].gpuSeconds
	})
	var victims []candidate
	for _, c := range order {
		if err := n.AddAssignment(c.assignment, 0, 0, oversub); err != nil {
			victims = append(victims, c)
			continue
		}
		if a.Place(n, r, &p).OK() {
			continue // reprieved
		}
		n.RemoveAssignment(c.assignment, 0, 0)
		victims = append(victims, c)
	}
	return victims, true
}

// nodeChoice is one node's answer to a preemption.
type nodeChoice struct {
	node    string
	victims []candidate
}

func (c nodeChoice) maxPriority() int32 {
	m := int32(-1 << 31)
	for _, v := range c.victims {
		m = max(m, v.priority)
	}
	return m
}

func (c nodeChoice) gpuSeconds() float64 {
	s := 0.0
	for _, v := range c.victims {
		s += v.gpuSeconds
	}
	return s
}

// better orders node choices: fewest victims, then the lowest priority
// among them, then the least GPU time lost, then the node name.
func better(a, b nodeChoice) bool {
	if len(a.victims) != len(b.victims) {
		return len(a.victims) < len(b.victims)
	}
	if a.maxPriority() != b.maxPriority() {
		return a.maxPriority() < b.maxPriority()
	}
	if a.gpuSeconds() != b.gpuSeconds() {
		return a.gpuSeconds() < b.gpuSeconds()
	}
	return a.node < b.node
}

// disruptionAllowed says whether every PodDisruptionBudget covering the pod
// allows one more disruption.
func disruptionAllowed(pod *v1.Pod, pdbs []*policyv1.PodDisruptionBudget) bool {
	for _, b := range matching(pod, pdbs) {
		if b.Status.DisruptionsAllowed <= 0 {
			return false
		}
	}
	return true
}

// withinBudgets says whether evicting all the victims together stays
// within every budget.
func withinBudgets(victims []candidate, pdbs []*policyv1.PodDisruptionBudget) bool {
	used := map[types.UID]int32{}
	for _, v := range victims {
		for _, b := range matching(v.pod, pdbs) {
			used[b.UID]++
			if used[b.UID] > b.Status.DisruptionsAllowed {
				return false
			}
		}
	}
	return true
}

func matching(pod *v1.Pod, pdbs []*policyv1.PodDisruptionBudget) []*policyv1.PodDisruptionBudget {
	var out []*policyv1.PodDisruptionBudget
	for _, b := range pdbs {
		if b.Namespace != pod.Namespace || b.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		out = append(out, b)
	}
	return out
}
