package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// TestAgentIsNodeBound sends every write the agent's RBAC grants (and a
// few it does not) with an agent token of the node concerned, of another
// node, and of no node, to an API server that authorizes with RBAC and
// runs the shipped policies: an agent's token is worth what kubelet's is
// under NodeRestriction, for Tessera's objects — its own Node's Tessera
// annotations, its own heartbeat Lease, the pods bound to its node
// (tessera.dev/checkpointed, Tessera's conditions, deleting one it
// refuses) — and nothing else (issue 38: one leaked token could cordon,
// taint and relabel every node, edit any pod, fail any pod and renew
// another node's Lease).
func TestAgentIsNodeBound(t *testing.T) {
	c := startCluster(t, "--authorization-mode=RBAC")
	admin := c.restConfig()
	if err := playground.Guard(c.ctx, admin); err != nil {
		t.Fatal(err)
	}
	as := map[string]kubernetes.Interface{
		"agent of n1":    kubernetes.NewForConfigOrDie(playground.AsAgent(admin, "n1")),
		"agent of n2":    kubernetes.NewForConfigOrDie(playground.AsAgent(admin, "n2")),
		"agent, no node": kubernetes.NewForConfigOrDie(playground.As(admin, deploy.AgentUser, nil)),
	}
	c.registerNode("n1")
	c.registerNode("n2")
	ns := c.namespace("team")
	for _, name := range []string{"on-n1", "doomed-on-n1", "on-n2"} {
		p := makePod(ns, podSpec{name: name, gpus: 1})
		if _, err := c.client.CoreV1().Pods(ns).Create(c.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		node := "n1"
		if name == "on-n2" {
			node = "n2"
		}
		b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Target: v1.ObjectReference{Kind: "Node", Name: node}}
		if err := kubernetes.NewForConfigOrDie(playground.As(admin, deploy.SchedulerUser, nil)).CoreV1().Pods(ns).Bind(c.ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// n2's heartbeat, as its agent left it.
	if err := inventory.Heartbeat(c.ctx, kubernetes.NewForConfigOrDie(playground.AsAgent(admin, "n2")), deploy.Namespace, "n2", metav1.Now().Time, time.Minute); err != nil {
		t.Fatal(err)
	}

	merge := func(v any) []byte { b, _ := json.Marshal(v); return b }
	meta := func(field string, kv map[string]*string) []byte {
		return merge(map[string]any{"metadata": map[string]any{field: kv}})
	}
	patchNode := func(node string, patch []byte) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return err
		}
	}
	patchPod := func(pod string, patch []byte, sub ...string) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, sub...)
			return err
		}
	}
	deletePod := func(pod string) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			return cs.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{})
		}
	}
	beat := func(node string) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			return inventory.Heartbeat(ctx, cs, deploy.Namespace, node, metav1.Now().Time, time.Minute)
		}
	}
	inv := func(node string) []byte {
		return meta("annotations", map[string]*string{gpu.AnnotationInventory: ptr(`{"v":"v1","node":"` + node + `","gpus":[]}`)})
	}
	condition := func(t v1.PodConditionType) []byte {
		return merge(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{{Type: t, Status: v1.ConditionTrue, Reason: "Test"}}}})
	}
	cordon := merge(map[string]any{"spec": map[string]any{"unschedulable": true}})
	taint := merge(map[string]any{"spec": map[string]any{"taints": []v1.Taint{{Key: "evil", Effect: v1.TaintEffectNoSchedule}}}})
	checkpointed := meta("annotations", map[string]*string{preemption.AnnotationCheckpointed: ptr("2026-12-07T10:00:00Z")})
	checkpointURL := meta("annotations", map[string]*string{"tessera.dev/checkpoint-url": ptr("http://attacker.example/")})
	const (
		bound  = "tessera-agent-node-bound"
		noNode = "this tessera-agent token names no node"
	)

	steps := []step{
		// Nodes: patch is all RBAC gives.
		{"publish its own inventory", "agent of n1", patchNode("n1", inv("n1")), "", ""},
		{"write a Tessera annotation of another node", "agent of n1", patchNode("n2", meta("annotations", map[string]*string{"tessera.dev/note": ptr("x")})),
			bound, "tessera-agent of node n1 may not update node n2: an agent writes only its own node"},
		{"label its own node", "agent of n1", patchNode("n1", meta("labels", map[string]*string{"team.example/rack": ptr("7")})),
			bound, "may change only the tessera.dev/ annotations and labels of its node"},
		{"label another node", "agent of n1", patchNode("n2", meta("labels", map[string]*string{"node-role.kubernetes.io/control-plane": ptr("")})),
			bound, "may not update node n2"},
		{"cordon its own node", "agent of n1", patchNode("n1", cordon), bound, "not its spec (cordon, taints)"},
		{"cordon another node", "agent of n1", patchNode("n2", cordon), bound, "may not update node n2"},
		{"taint another node", "agent of n1", patchNode("n2", taint), bound, "may not update node n2"},
		{"label a node, no node named", "agent, no node", patchNode("n1", meta("labels", map[string]*string{"x": ptr("y")})), bound, noNode},
		{"publish an inventory, no node named", "agent, no node", patchNode("n1", meta("annotations", map[string]*string{"tessera.dev/note": ptr("x")})), bound, noNode},
		{"delete a node", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			return cs.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{})
		}, "rbac", `cannot delete resource "nodes"`},
		{"report its node not ready", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, []byte(`{"status":{"conditions":[{"type":"Ready","status":"False"}]}}`), metav1.PatchOptions{}, "status")
			return err
		}, "rbac", `cannot patch resource "nodes/status"`},

		// Pods: get, list, watch, patch, delete; pods/status: patch.
		{"report a checkpoint of its node's pod", "agent of n1", patchPod("on-n1", checkpointed), "", ""},
		{"report a checkpoint of another node's pod", "agent of n1", patchPod("on-n2", checkpointed),
			"tessera-checkpointed|" + bound, "tessera-agent of node n1 may not report a checkpoint of a pod on node n2|tessera-agent of node n1 may not update pod on-n2, which is bound to node n2"},
		{"rewrite the checkpoint URL of its node's pod", "agent of n1", patchPod("on-n1", checkpointURL),
			bound, "may change only the tessera.dev/checkpointed annotation of pod on-n1"},
		{"rewrite the checkpoint URL of another node's pod", "agent of n1", patchPod("on-n2", checkpointURL),
			bound, "tessera-agent of node n1 may not update pod on-n2, which is bound to node n2: an agent writes only the pods bound to its node"},
		{"label another node's pod", "agent of n1", patchPod("on-n2", meta("labels", map[string]*string{"app": ptr("evil")})), bound, "bound to node n2"},
		{"label a pod, no node named", "agent, no node", patchPod("on-n1", meta("labels", map[string]*string{"app": ptr("evil")})), bound, noNode},
		{"set Tessera's condition on its node's pod", "agent of n1", patchPod("on-n1", condition(gpu.ConditionIsolation), "status"), "", ""},
		{"set Tessera's condition on another node's pod", "agent of n2", patchPod("on-n1", condition(gpu.ConditionIsolation), "status"),
			bound + "|tessera-gpu-pod-status", "tessera-agent of node n2 may not update pods/status of pod on-n1, which is bound to node n1|may not change the Tessera conditions of GPU pod on-n1"},
		{"mark its node's pod not ready", "agent of n1", patchPod("on-n1", condition(v1.PodReady), "status"),
			bound, "may change only Tessera's conditions among those of pod on-n1: kubelet reports the others"},
		{"fail another node's pod", "agent of n1", patchPod("on-n2", merge(map[string]any{"status": map[string]any{"phase": v1.PodFailed}}), "status"),
			bound + "|tessera-gpu-pod-status", "may not update pods/status of pod on-n2, which is bound to node n2|may not change the status.phase of GPU pod on-n2"},
		{"fail a pod, no node named", "agent, no node", patchPod("on-n2", merge(map[string]any{"status": map[string]any{"phase": v1.PodFailed}}), "status"),
			bound + "|tessera-gpu-pod-status", noNode + "|may not change the status.phase of GPU pod on-n2"},
		{"delete another node's pod", "agent of n1", deletePod("on-n2"), bound, "may not delete pod on-n2, which is bound to node n2"},
		{"delete a pod, no node named", "agent, no node", deletePod("on-n1"), bound, noNode},
		{"delete a pod it refused, on its node", "agent of n1", deletePod("doomed-on-n1"), "", ""},
		{"create a pod", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, makePod(ns, podSpec{name: "smuggled"}), metav1.CreateOptions{})
			return err
		}, "rbac", `cannot create resource "pods"`},
		{"evict a pod", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			return cs.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "on-n1", Namespace: ns}})
		}, "rbac", `cannot create resource "pods/eviction"`},

		// Leases: its own heartbeat only.
		{"renew its own heartbeat", "agent of n1", beat("n1"), "", ""},
		{"renew it again", "agent of n1", beat("n1"), "", ""},
		{"renew another node's heartbeat", "agent of n1", beat("n2"), bound, "tessera-agent of node n1 may not update Lease tessera-agent-n2: its heartbeat is tessera-agent-n1"},
		{"create another node's heartbeat", "agent of n2", beat("n3"), bound, "tessera-agent of node n2 may not create Lease tessera-agent-n3"},
		{"renew a heartbeat, no node named", "agent, no node", beat("n1"), bound, noNode},
		{"take the scheduler's leader Lease", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoordinationV1().Leases(deploy.Namespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tessera-scheduler"}}, metav1.CreateOptions{})
			return err
		}, bound, "may not create Lease tessera-scheduler"},
		{"delete its heartbeat", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			return cs.CoordinationV1().Leases(deploy.Namespace).Delete(ctx, "tessera-agent-n1", metav1.DeleteOptions{})
		}, "rbac", `cannot delete resource "leases"`},

		// ResourceSlices (the DRA driver): its own node's, of its driver.
		{"publish its node's slice", "agent of n1", createSlice("n1-gpus", "n1", "gpu.tessera.dev"), "", ""},
		{"update its node's slice", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			s, err := cs.ResourceV1().ResourceSlices().Get(ctx, "n1-gpus", metav1.GetOptions{})
			if err == nil {
				s.Spec.Pool.Generation++
				_, err = cs.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{})
			}
			return err
		}, "", ""},
		{"publish another node's slice", "agent of n1", createSlice("n2-gpus", "n2", "gpu.tessera.dev"),
			bound, "tessera-agent of node n1 may not create ResourceSlice n2-gpus (driver gpu.tessera.dev, node n2): an agent writes only its own node's gpu.tessera.dev slices"},
		{"publish another driver's slice on its node", "agent of n1", createSlice("n1-nics", "n1", "net.example.com"),
			bound, "may not create ResourceSlice n1-nics (driver net.example.com, node n1)"},
		{"publish a slice, no node named", "agent, no node", createSlice("n1-more", "n1", "gpu.tessera.dev"), bound, noNode},
		{"delete another node's slice", "agent of n2", func(ctx context.Context, cs kubernetes.Interface) error {
			return cs.ResourceV1().ResourceSlices().Delete(ctx, "n1-gpus", metav1.DeleteOptions{})
		}, bound, "tessera-agent of node n2 may not delete ResourceSlice n1-gpus"},
		{"delete its node's slice", "agent of n1", func(ctx context.Context, cs kubernetes.Interface) error {
			return cs.ResourceV1().ResourceSlices().Delete(ctx, "n1-gpus", metav1.DeleteOptions{})
		}, "", ""},
	}
	send(t, c.ctx, as, steps)

	// What passed did what it said, and what was refused left no trace.
	n1, n2 := mustGetNode(t, c, "n1"), mustGetNode(t, c, "n2")
	if n1.Annotations[gpu.AnnotationInventory] == "" || n1.Spec.Unschedulable || n2.Spec.Unschedulable || len(n2.Spec.Taints) > 0 || n2.Labels["node-role.kubernetes.io/control-plane"] != "" {
		t.Errorf("nodes after the steps: n1 %+v %v, n2 %+v %v", n1.Spec, n1.Annotations, n2.Spec, n2.Labels)
	}
	if _, err := c.client.CoreV1().Pods(ns).Get(c.ctx, "on-n2", metav1.GetOptions{}); err != nil {
		t.Errorf("on-n2: %v", err)
	}
}

// createSlice creates a ResourceSlice of driver for node's pool, with no
// device.
func createSlice(name, node, driver string) func(context.Context, kubernetes.Interface) error {
	return func(ctx context.Context, cs kubernetes.Interface) error {
		_, err := cs.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}, metav1.CreateOptions{})
		return err
	}
}

func mustGetNode(t *testing.T, c *cluster, name string) *v1.Node {
	t.Helper()
	n, err := c.client.CoreV1().Nodes().Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
