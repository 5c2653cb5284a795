package scheduler

import (
	"context"
	"errors"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

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
	c := readClaims(state)
	if c != nil {
		// Claims the cycle allocated but did not reserve go back, as
		// upstream's DynamicResources does.
		if _, st := p.claims.inner.PostFilter(ctx, state, pod, statuses); st.Code() == fwk.Error {
			return nil, st
		}
	}
	s := readState(state)
	if s == nil {
		if c != nil && c.req != nil {
			return p.preemptForClaims(ctx, c, pod, statuses)
		}
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	p.accountExcluded(s)
	p.pending.set(pod, s.rejected.dominant())
	if s.rejected != nil && s.rejected.behind.Load() {
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

// accountExcluded adds the nodes PreFilter left out to the cycle's
// rejections: their reasons to the cluster-wide line and the pending
// reason, and, where the scheduler's snapshot of one shows an inventory the
// cache has not applied yet, the behind mark (see noteBehind) — a node that
// just became able to hold the pod was left out on the cache's word.
func (p *Plugin) accountExcluded(s *stateData) {
	if len(s.excluded) == 0 || s.rejected == nil {
		return
	}
	for _, x := range s.excluded {
		rejectedNodes[x.Reason.Code].Inc()
		s.rejected.addReason(x.Name, x.Reason)
	}
	if p.handle == nil || p.handle.SnapshotSharedLister() == nil {
		return
	}
	infos := p.handle.SnapshotSharedLister().NodeInfos()
	for _, x := range s.excluded {
		if s.rejected.behind.Load() {
			return
		}
		if n, err := infos.Get(x.Name); err == nil {
			p.noteBehind(s.rejected, n, !x.Reason.Code.FromInventory())
		}
	}
}

// preempt gathers the view, plans (planPreemption) and sends the plan's
// notices: PostFilter's work.
func (p *Plugin) preempt(ctx context.Context, s *stateData, pod *v1.Pod, statuses fwk.NodeToStatusReader) (*fwk.PostFilterResult, *fwk.Status) {
	logger := klog.FromContext(ctx).WithValues("preemptor", klog.KObj(pod))
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever {
		return nil, fwk.NewStatus(fwk.Unschedulable, "not preempting: the pod's preemptionPolicy is Never")
	}
	pods, err := p.pods.List(labels.Everything())
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	if !mayPreempt(pod, pods) {
		preemptions.WithLabelValues("impossible").Inc()
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption cannot make room: no GPU pod of lower priority to evict")
	}
	pdbs, err := p.pdbs.List(labels.Everything())
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	view := p.preemptionView(pod, pods, pdbs, statuses, time.Now())
	best := planPreemption(s.alloc, p.cache.Oversubscription(), pod, s.req, view)
	if best == nil {
		preemptions.WithLabelValues("impossible").Inc()
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption cannot make room: no node fits the pod even without every lower-priority GPU pod it may evict")
	}
	return p.carryOut(ctx, logger, pod, best, view.now, "Preempting GPU pods")
}

// carryOut notifies a plan's victims and nominates the pod to its node.
func (p *Plugin) carryOut(ctx context.Context, logger klog.Logger, pod *v1.Pod, best *nodeChoice, now time.Time, what string) (*fwk.PostFilterResult, *fwk.Status) {
	if err := p.notices().send(ctx, pod, best, now); errors.Is(err, errVictimChanged) {
		preemptions.WithLabelValues("conflict").Inc()
		return nil, fwk.NewStatus(fwk.Unschedulable, "preemption deferred: a chosen victim changed meanwhile (another preemption?); retrying")
	} else if err != nil {
		return nil, fwk.AsStatus(err)
	}
	if len(best.victims) > 0 {
		preemptions.WithLabelValues("started").Inc()
		victimsPerPreemption.Observe(float64(len(best.victims)))
		logger.Info(what, "node", best.node, "victims", victimNames(best.victims))
	}
	return &fwk.PostFilterResult{NominatingInfo: &fwk.NominatingInfo{NominatedNodeName: best.node, NominatingMode: fwk.ModeOverride}},
		fwk.NewStatus(fwk.Success)
}

// preemptionView gathers what victim selection reads, for the nodes where
// the GPUs were what failed: evicting GPU pods does not fix a node that
// lacks CPU, is cordoned, or carries a taint.
func (p *Plugin) preemptionView(preemptor *v1.Pod, pods []*v1.Pod, pdbs []*policyv1.PodDisruptionBudget, statuses fwk.NodeToStatusReader, now time.Time) *preemptionView {
	byNode := map[string][]*v1.Pod{}
	for _, q := range pods {
		switch {
		case q.Spec.NodeName != "":
			byNode[q.Spec.NodeName] = append(byNode[q.Spec.NodeName], q)
		case q.Status.NominatedNodeName != "" && q.UID != preemptor.UID:
			byNode[q.Status.NominatedNodeName] = append(byNode[q.Status.NominatedNodeName], q)
		}
	}
	v := &preemptionView{now: now, pdbs: pdbs}
	reclaiming := p.cache.Reclaiming()
	for _, name := range p.cache.NodeNames() {
		if st := statuses.Get(name); st == nil || st.Code() != fwk.Unschedulable || st.Plugin() != Name {
			continue
		}
		usage := p.cache.Snapshot(name)
		if usage == nil {
			continue
		}
		nv := nodeView{name: name, usage: usage, reclaiming: reclaiming[name]}
		for _, q := range byNode[name] {
			if q.Spec.NodeName == "" {
				np := nominatedPreemptor{pod: q}
				if corev1helpers.PodPriority(q) >= corev1helpers.PodPriority(preemptor) {
					if r, err := p.request(q); err == nil {
						np.req = r // only those the plan counts as placed
					}
				}
				nv.nominated = append(nv.nominated, np)
				continue
			}
			nv.bound = append(nv.bound, boundPod{pod: q, assignment: p.cache.Assignment(q.UID)})
		}
		v.nodes = append(v.nodes, nv)
	}
	return v
}

// victimNames is for messages.
func victimNames(vs []candidate) string {
	var names []string
	for _, v := range vs {
		names = append(names, podKey(v.pod))
	}
	return strings.Join(names, ", ")
}
