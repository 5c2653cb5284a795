package playground

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/daemon"

	"github.com/tessera-gpu/tessera/deploy"
)

// agentDaemonSet is the name of the chart's agent DaemonSet.
const agentDaemonSet = "tessera-agent"

// runAgentDaemonSet creates the chart's tessera-agent DaemonSet, as
// rendered with default values, and runs kube-controller-manager's
// DaemonSet controller on it: the controller makes a pod per node that its
// nodeSelector picks, the scheduler's default profile binds it, the node's
// kubelet reports it (agentChanged) and the controller counts it in the
// DaemonSet's status. It returns once every node's agent pod is ready.
func (c *Cluster) runAgentDaemonSet(ctx context.Context) error {
	objs, err := deploy.Objects(deploy.Agent)
	if err != nil {
		return fmt.Errorf("deploy/tessera-agent.yaml: %w", err)
	}
	var ds []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "DaemonSet" && u.GetName() == agentDaemonSet {
			ds = append(ds, u)
		}
	}
	if len(ds) != 1 {
		return fmt.Errorf("deploy/tessera-agent.yaml has %d DaemonSets named %s, want 1", len(ds), agentDaemonSet)
	}
	dctx, stop := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), klog.FromContext(ctx).WithName("daemonset-controller")))
	c.stopDaemonSets = stop
	factory := informers.NewSharedInformerFactory(c.Client, 0)
	dsc, err := daemon.NewDaemonSetsController(dctx, factory.Apps().V1().DaemonSets(), factory.Apps().V1().ControllerRevisions(),
		factory.Core().V1().Pods(), factory.Core().V1().Nodes(), c.Client, flowcontrol.NewBackOff(time.Second, 15*time.Second))
	if err != nil {
		return err
	}
	factory.Start(dctx.Done())
	go dsc.Run(dctx, 2)
	if err := Apply(ctx, c.Config, ds); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := c.Client.AppsV1().DaemonSets(ds[0].GetNamespace()).Get(ctx, agentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		s := got.Status
		return s.DesiredNumberScheduled == int32(len(c.Nodes)) && s.NumberReady == s.DesiredNumberScheduled, nil
	})
}

// isAgentPod says whether pod is one of the agent DaemonSet's.
func isAgentPod(pod *v1.Pod) bool {
	for _, o := range pod.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Name == agentDaemonSet && pod.Namespace == deploy.Namespace {
			return true
		}
	}
	return false
}

// agentReady is whether the node's agent pod is ready: while the agent
// runs (every pod is, where the kubelet was told nothing of an agent).
func (k *kubelet) agentReady() bool {
	return k.agentUp == nil || k.agentUp()
}

// agentChanged reports the node's agent pod again after its agent started
// or stopped, as kubelet does when the agent's container starts, or exits
// and waits in CrashLoopBackOff: ready, or not with one restart more.
func (k *kubelet) agentChanged(ctx context.Context) {
	k.runMu.Lock()
	informer := k.informer
	k.runMu.Unlock()
	if informer == nil || ctx == nil {
		return
	}
	for _, obj := range informer.GetStore().List() {
		pod := obj.(*v1.Pod)
		k.mu.Lock()
		_, running := k.running[pod.UID]
		k.mu.Unlock()
		if !running || !isAgentPod(pod) {
			continue
		}
		if err := k.reportAgent(ctx, pod); err != nil {
			klog.FromContext(ctx).Error(err, "Reporting the agent's pod failed", "pod", klog.KObj(pod))
		}
	}
}

// reportAgent writes the agent pod's container state: running and ready
// while the node's agent runs; else exited with an error and waiting to
// be restarted.
func (k *kubelet) reportAgent(ctx context.Context, pod *v1.Pod) error {
	pod = pod.DeepCopy()
	ready := k.agentReady()
	now := metav1.Now()
	for i := range pod.Status.ContainerStatuses {
		cs := &pod.Status.ContainerStatuses[i]
		cs.Ready = ready
		if ready {
			cs.State = v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}
			cs.Started = ptr(true)
			continue
		}
		cs.RestartCount++
		cs.Started = ptr(false)
		cs.LastTerminationState = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: now}}
		cs.State = v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: "back-off restarting failed container " + cs.Name + " in pod " + pod.Name}}
	}
	status := v1.ConditionTrue
	reason := ""
	if !ready {
		status, reason = v1.ConditionFalse, "ContainersNotReady"
	}
	setCondition(pod, v1.PodReady, status, reason)
	setCondition(pod, v1.ContainersReady, status, reason)
	_, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}
