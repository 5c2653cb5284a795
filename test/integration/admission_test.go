package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/deploy/chart"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// annotate is a merge patch setting (or, for a nil value, removing) pod or
// node annotations.
func annotate(kv map[string]*string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": kv}})
	return b
}

func ptr(s string) *string { return &s }

// refusedBy reports whether err is a refusal by one of policies ("a|b"; "rbac"
// for the authorizer) saying one of wants ("x|y"): where two policies both
// refuse a request, the API server names one of them.
func refusedBy(err error, policies, wants string) bool {
	msg := err.Error()
	from := false
	for _, p := range strings.Split(policies, "|") {
		if p == "rbac" && strings.Contains(msg, "cannot ") || strings.Contains(msg, "ValidatingAdmissionPolicy '"+p+"'") {
			from = true
		}
	}
	says := false
	for _, w := range strings.Split(wants, "|") {
		says = says || strings.Contains(msg, w)
	}
	return from && says
}

// step is one request of an admission test: who sends it, and the policy
// that must refuse it with a message holding want ("" when it must pass).
type step struct {
	name   string
	as     string
	do     func(context.Context, kubernetes.Interface) error
	policy string // "" when the request must pass; "rbac" for the authorizer's; "a|b" for either
	want   string // in the refusal; "x|y" for either
}

// send sends the steps in order, each as its identity, and checks each
// answer: let through, or a 403 from the named policy (or from RBAC)
// saying want.
func send(t *testing.T, ctx context.Context, as map[string]kubernetes.Interface, steps []step) {
	t.Helper()
	for _, s := range steps {
		cs, ok := as[s.as]
		if !ok {
			t.Fatalf("%s: no identity %q", s.name, s.as)
		}
		err := s.do(ctx, cs)
		switch {
		case s.policy == "" && err != nil:
			t.Errorf("%s (as %s): refused: %v", s.name, s.as, err)
		case s.policy == "":
		case err == nil:
			t.Errorf("%s (as %s): allowed, want refused by %s", s.name, s.as, s.policy)
		case !apierrors.IsForbidden(err) || !refusedBy(err, s.policy, s.want):
			t.Errorf("%s (as %s): refused with\n  %v\nwant 403 from %s saying %q", s.name, s.as, err, s.policy, s.want)
		default:
			t.Logf("%s (as %s): %v", s.name, s.as, err)
		}
	}
	t.Logf("%d requests sent", len(steps))
}

// TestAdmissionPolicies applies deploy/admission-policies.yaml to the real
// API server and sends every rule's forbidden request and its legitimate
// twin as the identities a cluster has: tessera-scheduler's service account,
// tessera-agent's with tokens bound to one node or another (the node name in
// the user's extra info, as a pod-bound token carries it), an ordinary
// user, and a cluster administrator (system:masters), through
// impersonation. The API server authorizes everything here (AlwaysAllow),
// so what is refused is refused by the policies alone.
func TestAdmissionPolicies(t *testing.T) {
	c := startCluster(t)
	admin := c.restConfig()
	if err := playground.Guard(c.ctx, admin); err != nil {
		t.Fatal(err)
	}
	as := map[string]kubernetes.Interface{
		"admin":          c.client,
		"alice":          kubernetes.NewForConfigOrDie(playground.As(admin, "alice", nil)),
		"scheduler":      kubernetes.NewForConfigOrDie(playground.As(admin, deploy.SchedulerUser, nil)),
		"agent of n1":    kubernetes.NewForConfigOrDie(playground.AsAgent(admin, "n1")),
		"agent of n2":    kubernetes.NewForConfigOrDie(playground.AsAgent(admin, "n2")),
		"agent, no node": kubernetes.NewForConfigOrDie(playground.As(admin, deploy.AgentUser, nil)),
		"kube-scheduler": kubernetes.NewForConfigOrDie(playground.As(admin, "system:kube-scheduler", nil)),
		"kubelet of n1":  kubernetes.NewForConfigOrDie(playground.As(admin, "system:node:n1", nil)),
		"kubelet of n2":  kubernetes.NewForConfigOrDie(playground.As(admin, "system:node:n2", nil)),
		"pod gc":         kubernetes.NewForConfigOrDie(playground.As(admin, "system:serviceaccount:kube-system:pod-garbage-collector", nil)),
		"kai":            kubernetes.NewForConfigOrDie(playground.As(admin, "system:serviceaccount:kai:kai-scheduler", nil)),
	}
	c.registerNode("n1")
	c.registerNode("n2")
	ns := c.namespace("team")
	c.namespace("team-prod")
	pcs, err := deploy.ShippedPriorityClasses()
	if err != nil {
		t.Fatal(err)
	}
	for i := range pcs {
		if _, err := c.client.SchedulingV1().PriorityClasses().Create(c.ctx, &pcs[i], metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The operator's decisions, as the chart's values would render them.
	decide(t, c, `admissionPolicies: {allowedHostPaths: [/data/datasets], priorityClassNamespaces: {gpu-critical: [team-prod], gpu-standard: [team, team-prod]}}`,
		"/data/datasets")
	// A GPU pod bound to n1 by tessera-scheduler with its assignment, and
	// one still pending.
	assignment := `{"v":"v1","node":"n1","containers":[{"name":"main","gpus":[{"uuid":"GPU-n1-00","memoryMiB":8192,"cores":100}],"mode":"mps"}]}`
	gpuPod := func(name string) *v1.Pod { return makePod(ns, podSpec{name: name, gpus: 1, memMi: 8192, cores: 10}) }
	create := func(p *v1.Pod) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		}
	}
	patchPod := func(name string, kv map[string]*string) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, annotate(kv), metav1.PatchOptions{})
			return err
		}
	}
	createIn := func(namespace string, p *v1.Pod) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{})
			return err
		}
	}
	setPhase := func(name string, phase v1.PodPhase) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			b, _ := json.Marshal(map[string]any{"status": map[string]any{"phase": phase}})
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
			return err
		}
	}
	setCondition := func(name string, condition v1.PodConditionType) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			b, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{{Type: condition, Status: v1.ConditionTrue, Reason: "Test"}}}})
			_, err := cs.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
			return err
		}
	}
	patchNode := func(name string, kv map[string]*string) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, annotate(kv), metav1.PatchOptions{})
			return err
		}
	}
	bind := func(name string, annotations map[string]string) func(context.Context, kubernetes.Interface) error {
		return func(ctx context.Context, cs kubernetes.Interface) error {
			b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
				Target: v1.ObjectReference{Kind: "Node", Name: "n1"}}
			return cs.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{})
		}
	}
	withPod := func(name string, edit func(*v1.Pod)) *v1.Pod {
		p := gpuPod(name)
		edit(p)
		return p
	}
	yes := true
	inventory := `{"v":"v1","node":"n1","gpus":[]}`

	steps := []step{
		// tessera-scheduler-annotations
		{"a pod created with an assignment", "alice", create(withPod("forged", func(p *v1.Pod) {
			p.Annotations = map[string]string{gpu.AnnotationAssignment: assignment}
		})), "tessera-scheduler-annotations", "may not be created with tessera.dev/assignment"},
		{"even by the scheduler", "scheduler", create(withPod("forged", func(p *v1.Pod) {
			p.Annotations = map[string]string{gpu.AnnotationAssignment: assignment}
		})), "tessera-scheduler-annotations", "may not be created with tessera.dev/assignment"},
		{"a pod created with a preemption notice", "admin", create(withPod("noticed", func(p *v1.Pod) {
			p.Annotations = map[string]string{preemption.AnnotationNotice: "{}"}
		})), "tessera-scheduler-annotations", "may not be created with tessera.dev/preemption"},
		{"a plain GPU pod", "alice", create(gpuPod("placed")), "", ""},
		{"a second plain GPU pod", "alice", create(gpuPod("pending")), "", ""},
		{"a user writes an assignment on a pending pod", "alice", patchPod("pending", map[string]*string{gpu.AnnotationAssignment: ptr(assignment)}),
			"tessera-scheduler-annotations", "only tessera-scheduler (" + deploy.SchedulerUser + ") may write tessera.dev/assignment, not alice"},
		{"a user binds a GPU pod", "alice", bind("placed", nil),
			"tessera-pod-binding", "alice may not bind pods: only schedulers do (" + deploy.SchedulerUser + ", system:kube-scheduler)"},
		{"an administrator binds a GPU pod", "admin", bind("placed", nil), "tessera-pod-binding", "may not bind pods: only schedulers do"},
		{"kube-scheduler binds with an assignment", "kube-scheduler", bind("placed", map[string]string{gpu.AnnotationAssignment: assignment}),
			"tessera-scheduler-annotations", "may write tessera.dev/assignment, not system:kube-scheduler"},
		{"the scheduler binds with an assignment", "scheduler", bind("placed", map[string]string{gpu.AnnotationAssignment: assignment}), "", ""},
		{"a user changes a bound pod's assignment", "alice", patchPod("placed", map[string]*string{gpu.AnnotationAssignment: ptr(strings.Replace(assignment, "8192", "81920", 1))}),
			"tessera-scheduler-annotations", "may write tessera.dev/assignment, not alice"},
		{"a user removes a bound pod's assignment", "alice", patchPod("placed", map[string]*string{gpu.AnnotationAssignment: nil}),
			"tessera-scheduler-annotations", "may write tessera.dev/assignment, not alice"},
		{"an administrator changes it", "admin", patchPod("placed", map[string]*string{gpu.AnnotationAssignment: ptr(strings.Replace(assignment, "8192", "81920", 1))}),
			"tessera-scheduler-annotations", "may write tessera.dev/assignment"},
		{"a status write carrying a changed assignment", "alice", func(ctx context.Context, cs kubernetes.Interface) error {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "placed", metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Annotations[gpu.AnnotationAssignment] = "{}"
			_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		}, "tessera-scheduler-annotations", "may write tessera.dev/assignment, not alice"},
		{"a user labels a bound pod", "alice", patchPod("placed", map[string]*string{"team.example/owner": ptr("alice")}), "", ""},
		{"a user writes a preemption notice", "alice", patchPod("placed", map[string]*string{preemption.AnnotationNotice: ptr("{}")}),
			"tessera-scheduler-annotations", "may write tessera.dev/preemption, not alice"},
		{"the scheduler writes a preemption notice", "scheduler", patchPod("placed", map[string]*string{preemption.AnnotationNotice: ptr("{}")}), "", ""},
		{"a user binds a pod without an assignment", "alice", bind("pending", nil), "tessera-pod-binding", "alice may not bind pods"},

		// tessera-gpu-pod-status
		{"a user fails a running GPU pod", "alice", setPhase("placed", v1.PodFailed),
			"tessera-gpu-pod-status", "alice may not change the status.phase of GPU pod placed: only the kubelet and tessera-agent of its node n1 report it"},
		{"an administrator fails it", "admin", setPhase("placed", v1.PodSucceeded), "tessera-gpu-pod-status", "may not change the status.phase of GPU pod placed"},
		{"another node's kubelet fails it", "kubelet of n2", setPhase("placed", v1.PodFailed),
			"tessera-gpu-pod-status", "system:node:n2 may not change the status.phase of GPU pod placed"},
		{"a user writes Tessera's condition", "alice", setCondition("placed", gpu.ConditionIsolation),
			"tessera-gpu-pod-status", "may not change the Tessera conditions of GPU pod placed"},
		{"its kubelet reports it running", "kubelet of n1", setPhase("placed", v1.PodRunning), "", ""},
		{"its agent writes Tessera's condition", "agent of n1", setCondition("placed", gpu.ConditionIsolation), "", ""},
		{"a user writes a condition of its own", "alice", setCondition("placed", "example.com/Warm"), "", ""},
		{"the pod garbage collector fails a pod whose node is gone", "pod gc", setPhase("pending", v1.PodFailed), "", ""},

		// tessera-checkpointed
		{"the agent of the pod's node reports a checkpoint", "agent of n1", patchPod("placed", map[string]*string{preemption.AnnotationCheckpointed: ptr("2026-12-03T10:00:00Z")}), "", ""},
		{"another node's agent reports it", "agent of n2", patchPod("placed", map[string]*string{preemption.AnnotationCheckpointed: ptr("2026-12-03T10:00:01Z")}),
			"tessera-checkpointed|tessera-agent-node-bound", "tessera-agent of node n2 may not report a checkpoint of a pod on node n1|tessera-agent of node n2 may not update pod placed"},
		{"a user reports it", "alice", patchPod("placed", map[string]*string{preemption.AnnotationCheckpointed: ptr("2026-12-03T10:00:01Z")}),
			"tessera-checkpointed", "only the tessera-agent of the pod's node may write tessera.dev/checkpointed, not alice"},
		{"the scheduler sets it", "scheduler", patchPod("placed", map[string]*string{preemption.AnnotationCheckpointed: ptr("2026-12-03T10:00:01Z")}),
			"tessera-checkpointed", "may write tessera.dev/checkpointed, not " + deploy.SchedulerUser},
		{"the scheduler withdraws a notice and its checkpoint", "scheduler", patchPod("placed", map[string]*string{preemption.AnnotationNotice: nil, preemption.AnnotationCheckpointed: nil}), "", ""},
		{"a pod created with a checkpoint", "alice", create(withPod("ckpt", func(p *v1.Pod) {
			p.Annotations = map[string]string{preemption.AnnotationCheckpointed: "now"}
		})), "tessera-checkpointed", "may not be created with tessera.dev/checkpointed"},

		// tessera-node-inventory
		{"the node's agent publishes its inventory", "agent of n1", patchNode("n1", map[string]*string{gpu.AnnotationInventory: ptr(inventory)}), "", ""},
		{"another node's agent writes it", "agent of n2", patchNode("n1", map[string]*string{gpu.AnnotationInventory: ptr(strings.Replace(inventory, "[]", "[{}]", 1))}),
			"tessera-node-inventory|tessera-agent-node-bound", "tessera-agent of node n2 may not write the inventory of node n1|tessera-agent of node n2 may not update node n1"},
		{"an agent token naming no node", "agent, no node", patchNode("n1", map[string]*string{gpu.AnnotationInventory: nil}),
			"tessera-node-inventory|tessera-agent-node-bound", "this tessera-agent token names no node"},
		{"a user rewrites an inventory", "alice", patchNode("n1", map[string]*string{gpu.AnnotationInventory: ptr(strings.Replace(inventory, "[]", "[{}]", 1))}),
			"tessera-node-inventory", "only tessera-agent (" + deploy.AgentUser + ") on node n1 may write its tessera.dev/inventory, not alice"},
		{"an administrator removes one", "admin", patchNode("n1", map[string]*string{gpu.AnnotationInventory: nil}),
			"tessera-node-inventory", "may write its tessera.dev/inventory"},
		{"a user labels a node", "alice", patchNode("n1", map[string]*string{"team.example/rack": ptr("7")}), "", ""},
		{"a node created with an inventory", "admin", func(ctx context.Context, cs kubernetes.Interface) error {
			n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3", Annotations: map[string]string{gpu.AnnotationInventory: inventory}}}
			_, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
			return err
		}, "tessera-node-inventory", "may write its tessera.dev/inventory"},
		{"the node's agent withdraws its inventory", "agent of n1", patchNode("n1", map[string]*string{gpu.AnnotationInventory: nil}), "", ""},

		// tessera-gpu-pod-limits
		{"a privileged GPU pod", "alice", create(withPod("priv", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &yes}
		})), "tessera-gpu-pod-limits", "GPU pod container main is privileged"},
		{"a privileged pod asking no GPU", "alice", create(withPod("priv-cpu", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources.Limits = nil
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &yes}
		})), "", ""},
		{"a GPU pod setting NVIDIA_VISIBLE_DEVICES", "alice", create(withPod("env-nvidia", func(p *v1.Pod) {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "OK", Value: "1"}, {Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		})), "tessera-gpu-pod-limits", "GPU pod container main sets NVIDIA_VISIBLE_DEVICES:"},
		{"an init container setting CUDA_VISIBLE_DEVICES", "alice", create(withPod("env-cuda", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "setup", Image: "busybox", Env: []v1.EnvVar{{Name: "CUDA_VISIBLE_DEVICES", Value: "0,1,2,3"}}}}
		})), "tessera-gpu-pod-limits", "GPU pod container setup sets CUDA_VISIBLE_DEVICES:"},
		{"a GPU pod lifting its MPS limit", "alice", create(withPod("env-mps", func(p *v1.Pod) {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", Value: "100"}, {Name: "TESSERA_GPU_MEMORY_LIMIT_MIB", Value: "81920"}}
		})), "tessera-gpu-pod-limits", "GPU pod container main sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, TESSERA_GPU_MEMORY_LIMIT_MIB:"},
		{"a GPU pod's envFrom without a prefix", "alice", create(withPod("envfrom", func(p *v1.Pod) {
			p.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}
		})), "tessera-gpu-pod-limits", "GPU pod container main uses envFrom without a safe prefix"},
		{"a GPU pod's envFrom under CUDA_", "alice", create(withPod("envfrom-cuda", func(p *v1.Pod) {
			p.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{Prefix: "CUDA_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}
		})), "tessera-gpu-pod-limits", "uses envFrom without a safe prefix"},
		{"a GPU pod sharing the node's PID namespace", "alice", create(withPod("hostpid", func(p *v1.Pod) {
			p.Spec.HostPID = true
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_PTRACE"}}}
		})), "tessera-gpu-pod-limits", "GPU pod sets hostPID"},
		{"a GPU pod sharing the node's IPC and network", "alice", create(withPod("hostipc", func(p *v1.Pod) { p.Spec.HostIPC, p.Spec.HostNetwork = true, true })),
			"tessera-gpu-pod-limits", "GPU pod sets hostIPC, hostNetwork: a GPU pod shares no namespace with its node"},
		{"a GPU pod adding SYS_PTRACE", "alice", create(withPod("ptrace", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_BIND_SERVICE", "SYS_PTRACE"}}}
		})), "tessera-gpu-pod-limits", "GPU pod container main: SYS_PTRACE adds a capability beyond the container runtime's defaults"},
		{"a GPU pod adding cap_sys_admin", "alice", create(withPod("sysadmin", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "setup", Image: "busybox",
				SecurityContext: &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"cap_sys_admin"}}}}}
		})), "tessera-gpu-pod-limits", "GPU pod container setup: SYS_ADMIN adds a capability"},
		{"a GPU pod adding a default capability", "alice", create(withPod("bind-low", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_BIND_SERVICE"}, Drop: []v1.Capability{"ALL"}}}
		})), "", ""},
		{"a pod asking no GPU sharing the node's PID namespace", "alice", create(withPod("hostpid-cpu", func(p *v1.Pod) {
			p.Spec.HostPID = true
			p.Spec.Containers[0].Resources.Limits = nil
		})), "", ""},

		// tessera-gpu-pod-scheduler
		{"a GPU pod for the default scheduler", "alice", create(withPod("default-sched", func(p *v1.Pod) { p.Spec.SchedulerName = "" })),
			"tessera-gpu-pod-scheduler", "GPU pod names spec.schedulerName default-scheduler, which does not book tessera.dev resources; set spec.schedulerName: tessera-scheduler"},
		{"a GPU pod for another scheduler", "admin", create(withPod("other-sched", func(p *v1.Pod) { p.Spec.SchedulerName = "elsewhere" })),
			"tessera-gpu-pod-scheduler", "names spec.schedulerName elsewhere"},
		{"a pod asking no GPU for the default scheduler", "alice", create(withPod("cpu-default-sched", func(p *v1.Pod) {
			p.Spec.SchedulerName = ""
			p.Spec.Containers[0].Resources.Limits = nil
		})), "", ""},

		// tessera-gpu-priority
		{"gpu-critical where it is not granted", "alice", create(withPod("critical", func(p *v1.Pod) { p.Spec.PriorityClassName = "gpu-critical" })),
			"tessera-gpu-priority", "priority class gpu-critical preempts GPU pods and is not granted to namespace team (granted: team-prod)"},
		{"gpu-critical where it is granted", "alice", createIn("team-prod", withPod("critical", func(p *v1.Pod) {
			p.Namespace, p.Spec.PriorityClassName = "team-prod", "gpu-critical"
		})), "", ""},
		{"gpu-standard where it is granted", "alice", create(withPod("standard", func(p *v1.Pod) { p.Spec.PriorityClassName = "gpu-standard" })), "", ""},
		{"gpu-batch anywhere", "alice", create(withPod("batch", func(p *v1.Pod) { p.Spec.PriorityClassName = "gpu-batch" })), "", ""},
		{"system-node-critical for a GPU pod", "alice", create(withPod("sys-critical", func(p *v1.Pod) { p.Spec.PriorityClassName = "system-node-critical" })),
			"tessera-gpu-priority", "GPU pod uses priority class system-node-critical outside kube-system"},
		{"system-node-critical for a pod with a ResourceClaim", "alice", create(withPod("sys-critical-claim", func(p *v1.Pod) {
			p.Spec.PriorityClassName = "system-node-critical"
			p.Spec.Containers[0].Resources.Limits = nil
			p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: func() *string { s := "gpu-slice"; return &s }()}}
			p.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
		})), "tessera-gpu-priority", "GPU pod uses priority class system-node-critical outside kube-system"},
		{"system-cluster-critical for a pod asking no GPU", "alice", create(withPod("sys-critical-cpu", func(p *v1.Pod) {
			p.Spec.PriorityClassName = "system-cluster-critical"
			p.Spec.Containers[0].Resources.Limits = nil
		})), "", ""},
		{"a GPU pod's envFrom under APP_", "alice", create(withPod("envfrom-app", func(p *v1.Pod) {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "CUDA_LAUNCH_BLOCKING", Value: "1"}}
			p.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{Prefix: "APP_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}
		})), "", ""},
	}
	hostPaths := []struct {
		path string
		want string // "" when allowed
	}{
		{"/dev/nvidia0", "mounts host path /dev/nvidia0"},
		{"/dev/nvidiactl", "mounts host path /dev/nvidiactl"},
		{"/dev", "mounts host path /dev"},
		{"/", "mounts host path /"},
		{"/run/tessera/mps", "mounts host path /run/tessera/mps"},
		{"/var/run/tessera", "mounts host path /var/run/tessera"},
		{"/run", "mounts host path /run"},
		{"/var/run/cdi", "mounts host path /var/run/cdi"},
		{"/etc/cdi/tessera.json", "mounts host path /etc/cdi/tessera.json"},
		{"/var/lib/kubelet/device-plugins", "mounts host path /var/lib/kubelet/device-plugins"},
		{"/var/lib/kubelet", "mounts host path /var/lib/kubelet"},
		{"/dev//nvidia0", "hostPath /dev//nvidia0 is not a plain absolute path"},
		{"/dev/./nvidia0", "hostPath /dev/./nvidia0 is not a plain absolute path"},
		{"/dev/", "hostPath /dev/ is not a plain absolute path"},
		{"/data/datasets", ""},
		// Around a string check (issue 38): the host's root through its
		// init process, the runtime's and cgroups' directories, paths
		// below or beside the allowed one.
		{"/proc/1/root/run/tessera", "mounts host path /proc/1/root/run/tessera, which is not on the operator's allow-list (/data/datasets;"},
		{"/proc/1/root/var/lib/kubelet/pod-resources", "mounts host path /proc/1/root/var/lib/kubelet/pod-resources, which is not on the operator's allow-list"},
		{"/proc/self/root/run/tessera", "which is not on the operator's allow-list"},
		{"/run/containerd", "mounts host path /run/containerd"},
		{"/sys/fs/cgroup", "mounts host path /sys/fs/cgroup, which is not on the operator's allow-list"},
		{"/data/datasets/link-to-run", "mounts host path /data/datasets/link-to-run, which is not on the operator's allow-list"},
		{"/data", "mounts host path /data, which is not on the operator's allow-list"},
		{"/dev/shm", "mounts host path /dev/shm, which is not on the operator's allow-list"},
	}
	for i, hp := range hostPaths {
		policy := ""
		if hp.want != "" {
			policy = "tessera-gpu-pod-limits"
		}
		p := withPod("hostpath-"+string(rune('a'+i)), func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: hp.path}}}}
		})
		steps = append(steps, step{"a GPU pod mounting host path " + hp.path, "alice", create(p), policy, hp.want})
	}
	steps = append(steps, []step{
		{"a privileged ephemeral container in a GPU pod", "alice", func(ctx context.Context, cs kubernetes.Interface) error {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, "placed", metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{
				Name: "debug", Image: "busybox", SecurityContext: &v1.SecurityContext{Privileged: &yes}}}}
			_, err = cs.CoreV1().Pods(ns).UpdateEphemeralContainers(ctx, "placed", p, metav1.UpdateOptions{})
			return err
		}, "tessera-gpu-pod-limits", "GPU pod container debug is privileged"},
		{"a GPU pod asking memory only", "alice", create(withPod("mem-only-priv", func(p *v1.Pod) {
			p.Spec.Containers[0].Resources.Limits = v1.ResourceList{gpu.ResourceMemory: resource.MustParse("4096")}
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &yes}
		})), "tessera-gpu-pod-limits", "is privileged"},

		// tessera-gpu-pod-node-name
		{"a GPU pod naming its node", "alice", create(withPod("pinned", func(p *v1.Pod) { p.Spec.NodeName = "n1" })),
			"tessera-gpu-pod-node-name", "GPU pod names spec.nodeName n1 itself, which skips tessera-scheduler"},
		{"a pod asking no GPU naming its node", "alice", create(withPod("pinned-cpu", func(p *v1.Pod) {
			p.Spec.NodeName = "n1"
			p.Spec.Containers[0].Resources.Limits = nil
		})), "", ""},
	}...)

	send(t, c.ctx, as, steps)

	// Another scheduler of the cluster binds its own pods once the operator
	// lists it in binders (chart value admissionPolicies.binders).
	kaiPod := withPod("kai-pod", func(p *v1.Pod) {
		p.Spec.SchedulerName = "kai-scheduler"
		p.Spec.Containers[0].Resources.Limits = nil
	})
	send(t, c.ctx, as, []step{
		{"a pod asking no GPU for another scheduler", "alice", create(kaiPod), "", ""},
		{"the other scheduler binds it, unlisted", "kai", bind("kai-pod", nil), "tessera-pod-binding", "system:serviceaccount:kai:kai-scheduler may not bind pods"},
	})
	decide(t, c, `admissionPolicies: {allowedHostPaths: [/data/datasets], binders: ["system:serviceaccount:kai:kai-scheduler"]}`, "/data/datasets")
	var bound error
	err = wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		bound = bind("kai-pod", nil)(ctx, as["kai"])
		return bound == nil, nil
	})
	if err != nil {
		t.Errorf("the listed scheduler could not bind its pod within a minute: %v", bound)
	}
	// What passed did what it said.
	placed, err := c.client.CoreV1().Pods(ns).Get(c.ctx, "placed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if placed.Spec.NodeName != "n1" || placed.Annotations[gpu.AnnotationAssignment] != assignment {
		t.Errorf("placed: node %q, assignment %q", placed.Spec.NodeName, placed.Annotations[gpu.AnnotationAssignment])
	}
}

// decide renders the chart with the operator's admissionPolicies values,
// applies the ConfigMap they fill (tessera-admission, which the policies
// read), and waits until the API server's policies see it: a pod mounting
// each allowed host path passes a dry run.
func decide(t *testing.T, c *cluster, values string, allowed ...string) {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(values), &v); err != nil {
		t.Fatal(err)
	}
	r, err := chart.Render(v, chart.Options{})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := r.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var cm []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "ConfigMap" && u.GetName() == deploy.AdmissionConfigMap {
			cm = append(cm, u)
		}
	}
	if len(cm) != 1 {
		t.Fatalf("the chart rendered %d ConfigMaps %s", len(cm), deploy.AdmissionConfigMap)
	}
	if err := playground.Apply(c.ctx, c.restConfig(), cm); err != nil {
		t.Fatal(err)
	}
	p := makePod(metav1.NamespaceDefault, podSpec{name: "decided", gpus: 1})
	for i, path := range allowed {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: fmt.Sprintf("v%d", i), VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path}}})
	}
	var last error
	err = wait.PollUntilContextTimeout(c.ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = c.client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the policies did not take the operator's decisions (%s) within a minute: %v", values, last)
	}
}
