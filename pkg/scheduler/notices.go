package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/patch"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// errVictimChanged says a victim changed between the cycle's view and its
// notice.
var errVictimChanged = errors.New("victim changed since it was chosen")

// noticeSender carries out a preemption plan: it gives each victim its
// notice — the annotation the agent and the preemption controller act on —
// the DisruptionTarget condition, and events on both pods. What happens to
// the victims next (the signal, the deadline, the deletion) is the agent's
// and the preemption controller's.
type noticeSender struct {
	client   kubernetes.Interface
	recorder events.EventRecorder // nil: no events
	grace    time.Duration
}

func (p *Plugin) notices() *noticeSender {
	return &noticeSender{client: p.handle.ClientSet(), recorder: p.handle.EventRecorder(), grace: p.preemptCfg.GracePeriod.Duration}
}

// send notifies the plan's victims, in order; it stops at errVictimChanged
// when a victim changed since the view was gathered.
func (ns *noticeSender) send(ctx context.Context, preemptor *v1.Pod, c *nodeChoice, now time.Time) error {
	client := ns.client
	for _, v := range c.victims {
		n := &preemption.Notice{
			Preemptor: podKey(preemptor), PreemptorUID: string(preemptor.UID), Node: c.node,
			Reason:   fmt.Sprintf("GPU slices on %s needed by %s (priority %d > %d)", c.node, podKey(preemptor), corev1helpers.PodPriority(preemptor), v.priority),
			NoticeAt: now.UTC(), Deadline: now.Add(preemption.Grace(v.pod, ns.grace)).UTC(),
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
		if r := ns.recorder; r != nil {
			r.Eventf(v.pod, preemptor, v1.EventTypeNormal, "PreemptionNotice", "Preempting",
				"Checkpoint requested by %s; stopped at %s unless it exits or reports its checkpoint first", podKey(preemptor), n.Deadline.Format(time.RFC3339))
			r.Eventf(preemptor, v.pod, v1.EventTypeNormal, "Preempting", "Preempting", "Preempting %s on %s for GPU slices", podKey(v.pod), c.node)
		}
	}
	return nil
}
