// Package nodepreempt is the node's part of GPU preemption: it delivers a
// victim's notice into its containers (a file in its notice directory, and
// the signal or POST its pod asked for), reports the checkpoint the
// workload wrote, takes a withdrawn notice back, and, once the victim's
// containers stopped, reclaims its GPUs — kills its leftover GPU processes,
// takes a GPU out of service while one will not die — and lists the victim
// as reclaimed in the node's inventory, which lets the scheduler give its
// slices to the preemptor.
//
// What one look at the node's pods asks is decided by plan, a pure
// function of the pods and the victims known (plan.go); the Preemptor
// carries it out (preemptor.go), as the scheduler's preemption plans its
// victims purely and a sender notifies them.
package nodepreempt

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// known is what the plan needs of a victim already tracked: whether its
// reclaim is under way.
type known struct {
	reclaiming bool
}

// newVictim is a pod newly under a notice: its notice, and the GPUs its
// assignment holds on this node.
type newVictim struct {
	pod    *v1.Pod
	notice *preemption.Notice
	gpus   []string
}

// steps is what one look at the node's pods asks.
type steps struct {
	// notify are the pods newly under a notice: track them, deliver it.
	notify []newVictim
	// checkpoint are the victims that have not reported a checkpoint:
	// look for the one their workload may have written.
	checkpoint []*v1.Pod
	// withdraw are victims whose pod runs on with no notice any more (the
	// scheduler spared it): take the notice back from its containers.
	withdraw []types.UID
	// reclaim are victims whose containers stopped: reclaim their GPUs.
	reclaim []types.UID
}

// plan decides one look at node's pods, given the victims known. It does
// no I/O: a victim's GPUs come from its bound assignment on this node and
// from claimGPUs, the GPUs of the DRA claims prepared for each pod here.
func plan(node string, pods []*v1.Pod, victims map[types.UID]known, claimGPUs map[types.UID][]string) steps {
	var out steps
	running := map[types.UID]bool{}   // pods whose containers may still run
	withdrawn := map[types.UID]bool{} // running, and no longer under notice
	all := map[types.UID]known{}
	for uid, v := range victims {
		all[uid] = v
	}
	for _, p := range pods {
		if !podgpu.Finished(p) {
			running[p.UID] = true
		}
		n, err := preemption.NoticeOf(p)
		if err != nil || n == nil {
			withdrawn[p.UID] = true
			continue
		}
		if _, ok := all[p.UID]; !ok {
			gpus := gpusOn(node, p)
			for _, g := range claimGPUs[p.UID] {
				if !slices.Contains(gpus, g) {
					gpus = append(gpus, g)
				}
			}
			out.notify = append(out.notify, newVictim{pod: p, notice: n, gpus: gpus})
			all[p.UID] = known{}
		}
		if _, done := p.Annotations[preemption.AnnotationCheckpointed]; !done {
			out.checkpoint = append(out.checkpoint, p)
		}
	}
	for uid, v := range all {
		switch {
		case v.reclaiming:
		case running[uid] && withdrawn[uid]:
			out.withdraw = append(out.withdraw, uid)
		case !running[uid]:
			out.reclaim = append(out.reclaim, uid)
		}
	}
	slices.Sort(out.withdraw)
	slices.Sort(out.reclaim)
	return out
}

// gpusOn is the GPUs a pod's bound assignment holds on node, each once.
func gpusOn(node string, p *v1.Pod) []string {
	var out []string
	asg, err := podgpu.BoundAssignment(p)
	if err != nil || asg == nil || asg.Node != node {
		return nil
	}
	for _, c := range asg.Containers {
		for _, g := range c.GPUs {
			if !slices.Contains(out, g.UUID) {
				out = append(out, g.UUID)
			}
		}
	}
	return out
}
