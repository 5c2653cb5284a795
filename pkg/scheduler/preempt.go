package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/patch"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

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

// PostFilter is Tessera's GPU preemption: for a GPU pod that fits nowhere,
// it looks for the node where evicting the fewest, lowest-priority GPU pods
// opens a fitting fragment, never evicting a pod of equal or higher
// priority, a pod whose PodDisruptionBudget allows no disruption, or anyone
// for a pod whose PriorityClass says preemptionPolicy: Never. The victims get
// a checkpoint notice (soft preemption; pkg/preemption carries on) and the
// pod is nominated to the node, which keeps the freed slices for it. When no
// set of victims makes the pod fit, no one is evicted.
//
// Its message, which the framework appends to the pod's "0/N nodes are
// available: …", starts with the cycle's one cluster-wide line: the largest
// free GPU fragment anywhere and how many nodes were short of what.
func (p *Plugin) PostFilter(ctx context.Context, state fwk.CycleState, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	defer observe("PostFilter", time.Now())
	s := readState(state)
	if s == nil {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	pending.reasons.set(pod, s.rejected.dominant())
	if s.rejected.wasBehind() {
		p.waiting.add(p.cache, p.queue, pod, s.freedAt, klog.FromContext(ctx))
	}
	res, st := p.preempt(ctx, s, pod, statuses)
	if line := s.rejected.summary(); line != "" && st != nil && st.Code() == fwk.Unschedulable {
		msg := line
		if m := st.Message(); m != "" {
			msg += ". " + m
		}
		st = fwk.NewStatus(fwk.Unschedulable, msg)
	}
	return res, st
}

// preempt chooses victims and notifies them (PostFilter's work).
func (p *Plugin) preempt(ctx context.Context, s *stateData, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	logger := klog.FromContext(ctx).WithValues("preemptor", klog.KObj(pod))
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever {
		return nil, fwk.NewStatus(fwk.Unschedulable, "not preempting: the pod's preemptionPolicy is Never")
	}
	prio := corev1helpers.PodPriority(pod)
	pods, err := p.pods.List(labels.Everything())
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	pdbs, err := p.pdbs.List(labels.Everything())
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	byNode := map[string][]*v1.Pod{}
	// A cluster full of pods of the preemptor's priority or higher (a
	// batch queue at one priority) is the common case: answer it without
	// looking at any node.
	hope := false
	for _, q := range pods {
		if q.Spec.NodeName != "" {
			byNode[q.Spec.NodeName] = append(byNode[q.Spec.NodeName], q)
			if !hope && podgpu.WantsGPU(q) {
				if n, _ := preemption.NoticeOf(q); n != nil {
					hope = n.PreemptorUID == string(pod.UID)
				} else {
					hope = corev1helpers.PodPriority(q) < prio
				}
			}
		} else if q.Status.NominatedNodeName != "" && q.UID != pod.UID {
			byNode[q.Status.NominatedNodeName] = append(byNode[q.Status.NominatedNodeName], q)
		}
	}
	if !hope {
		preemptions.WithLabelValues("impossible").Inc()
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption cannot make room: no GPU pod of lower priority to evict")
	}
	now := time.Now()
	var best *nodeChoice
	for _, name := range p.cache.NodeNames() {
		// Only where the GPUs were what failed: evicting GPU pods does not
		// fix a node that lacks CPU, is cordoned, or carries a taint.
		if st := statuses.Get(name); st == nil || st.Code() != fwk.Unschedulable || st.Plugin() != Name {
			continue
		}
		base := p.cache.Snapshot(name)
		if base == nil {
			continue
		}
		var cands []candidate
		blocked, freed := false, false
		// Pods nominated here with at least our priority are promised
		// their slices: their victims are as good as gone, and they count
		// as placed.
		promised := map[types.UID]*v1.Pod{}
		var promisedOrder []*v1.Pod
		for _, q := range byNode[name] {
			if q.Spec.NodeName == "" && corev1helpers.PodPriority(q) >= prio {
				promised[q.UID] = q
				promisedOrder = append(promisedOrder, q)
			}
		}
		// Highest priority first, then oldest: the order the scheduling
		// queue serves them.
		sort.SliceStable(promisedOrder, func(i, j int) bool {
			pi, pj := corev1helpers.PodPriority(promisedOrder[i]), corev1helpers.PodPriority(promisedOrder[j])
			if pi != pj {
				return pi > pj
			}
			return promisedOrder[i].CreationTimestamp.Before(&promisedOrder[j].CreationTimestamp)
		})
		for _, q := range byNode[name] {
			if q.Spec.NodeName == "" {
				continue
			}
			a := p.cache.Assignment(q.UID)
			if a == nil || podgpu.Finished(q) {
				continue
			}
			if n, _ := preemption.NoticeOf(q); n != nil {
				// Already a victim: of ours (an earlier cycle) or of a
				// promised preemptor, it is going away; of a lower
				// preemptor, it stays as it is.
				if _, ok := promised[types.UID(n.PreemptorUID)]; ok || n.PreemptorUID == string(pod.UID) {
					base.RemoveAssignment(a, 0, 0)
					freed = true
				}
				continue
			}
			if corev1helpers.PodPriority(q) >= prio || q.DeletionTimestamp != nil {
				continue
			}
			if !disruptionAllowed(q, pdbs) {
				continue
			}
			started := q.CreationTimestamp.Time
			if q.Status.StartTime != nil {
				started = q.Status.StartTime.Time
			}
			cands = append(cands, candidate{pod: q, assignment: a, priority: corev1helpers.PodPriority(q),
				gpuSeconds: gpuShare(a) * now.Sub(started).Seconds()})
		}
		for _, q := range promisedOrder {
			r, err := p.compile(q)
			if err != nil {
				continue
			}
			var pl allocator.Placement
			if !s.alloc.Place(base, r, &pl).OK() {
				blocked = true // its victims are not enough yet; do not compete
				break
			}
			base.Apply(r, &pl)
		}
		if blocked || (len(cands) == 0 && !freed) {
			// Nothing would leave: Filter's verdict stands.
			continue
		}
		victims, ok := selectVictims(s.alloc, base, s.req, cands, p.cache.oversub)
		if !ok || !withinBudgets(victims, pdbs) {
			continue
		}
		c := nodeChoice{node: name, victims: victims}
		if best == nil || better(c, *best) {
			best = &c
		}
	}
	if best == nil {
		preemptions.WithLabelValues("impossible").Inc()
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption cannot make room: no node fits the pod even without every lower-priority GPU pod it may evict")
	}
	if err := p.notify(ctx, pod, best, now); errors.Is(err, errVictimChanged) {
		preemptions.WithLabelValues("conflict").Inc()
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption deferred: a chosen victim changed meanwhile (another preemption?); retrying")
	} else if err != nil {
		return nil, fwk.AsStatus(err)
	}
	if len(best.victims) > 0 {
		preemptions.WithLabelValues("started").Inc()
		victimsPerPreemption.Observe(float64(len(best.victims)))
		logger.Info("Preempting GPU pods", "node", best.node, "victims", victimNames(best.victims))
	}
	return &fwk.PostFilterResult{NominatingInfo: &fwk.NominatingInfo{NominatedNodeName: best.node, NominatingMode: fwk.ModeOverride}},
		fwk.NewStatus(fwk.Success)
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

// errVictimChanged says a victim changed between the cycle's view and its
// notice.
var errVictimChanged = errors.New("victim changed since it was chosen")

// notify gives each victim its notice: the annotation the agent and the
// preemption controller act on, the DisruptionTarget condition, and events
// on both pods.
func (p *Plugin) notify(ctx context.Context, preemptor *v1.Pod, c *nodeChoice, now time.Time) error {
	client := p.handle.ClientSet()
	for _, v := range c.victims {
		n := &preemption.Notice{
			Preemptor: podKey(preemptor), PreemptorUID: string(preemptor.UID), Node: c.node,
			Reason:   fmt.Sprintf("GPU slices on %s needed by %s (priority %d > %d)", c.node, podKey(preemptor), corev1helpers.PodPriority(preemptor), v.priority),
			NoticeAt: now.UTC(), Deadline: now.Add(preemption.Grace(v.pod, p.preemptCfg.GracePeriod.Duration)).UTC(),
		}
		// The resourceVersion makes the patch conditional: a victim that
		// changed since this cycle's view of it — another preemptor's
		// notice the informer has not delivered yet — is not notified
		// twice, and this preemption is retried on a fresh view.
		notice := n.Encode()
		notify := patch.Annotations(v.pod.ResourceVersion, map[string]*string{preemption.AnnotationNotice: &notice})
		if _, err := client.CoreV1().Pods(v.pod.Namespace).Patch(ctx, v.pod.Name, types.MergePatchType, notify, metav1.PatchOptions{}); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return errVictimChanged
			}
			return fmt.Errorf("notify victim %s: %w", podKey(v.pod), err)
		}
		cond := patch.PodCondition(v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: preemption.ConditionReason,
			Message: "checkpoint requested: " + n.Reason, LastTransitionTime: metav1.NewTime(now.UTC().Truncate(time.Second))})
		if _, err := client.CoreV1().Pods(v.pod.Namespace).Patch(ctx, v.pod.Name, types.StrategicMergePatchType, cond, metav1.PatchOptions{}, "status"); err != nil {
			klog.FromContext(ctx).V(2).Info("Could not set the DisruptionTarget condition", "pod", klog.KObj(v.pod), "err", err)
		}
		if r := p.handle.EventRecorder(); r != nil {
			r.Eventf(v.pod, preemptor, v1.EventTypeNormal, "PreemptionNotice", "Preempting",
				"Checkpoint requested by %s; stopped at %s unless it exits or reports its checkpoint first", podKey(preemptor), n.Deadline.Format(time.RFC3339))
			r.Eventf(preemptor, v.pod, v1.EventTypeNormal, "Preempting", "Preempting", "Preempting %s on %s for GPU slices", podKey(v.pod), c.node)
		}
	}
	return nil
}

// victimNames is for messages.
func victimNames(vs []candidate) string {
	var names []string
	for _, v := range vs {
		names = append(names, podKey(v.pod))
	}
	return strings.Join(names, ", ")
}
