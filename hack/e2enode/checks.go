//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/playground"
)

// checks holds what the checks share: the cluster's clients and the run's
// report.
type checks struct {
	ctx    context.Context
	n      *node
	r      *report
	admin  *rest.Config
	client kubernetes.Interface
	tenant kubernetes.Interface // asTenant's, once made
	tag    string
}

const (
	ns         = deploy.Namespace
	tenant     = "team"
	tenantUser = "alice"
	scheduler  = "tessera-scheduler"
	gpuLabel   = "nvidia.com/gpu.present"
)

func newChecks(ctx context.Context, n *node, r *report) (*checks, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", n.admin)
	if err != nil {
		return nil, err
	}
	return &checks{ctx: ctx, n: n, r: r, admin: cfg, client: kubernetes.NewForConfigOrDie(cfg)}, nil
}

// run runs the checks in order; it stops at the first whose failure leaves
// the rest meaningless (the node, the images, the install).
func (c *checks) run() error {
	if err := c.r.detailed("the node's network leads nowhere off the machine; its resolver is none of the host's", c.network); err != nil {
		return err
	}
	if err := c.r.detailed("the node registers and is Ready", c.nodeReady); err != nil {
		return err
	}
	if err := c.r.detailed("make images' archives and the pause image imported into containerd", func() (string, error) {
		tag, err := c.n.importImages(c.ctx)
		c.tag = tag
		return "tag " + tag, err
	}); err != nil {
		return err
	}
	if err := c.r.detailed("helm install, the README's command", c.install); err != nil {
		return err
	}
	// Each check from here on says what it found; a failure does not stop
	// the others.
	_ = c.r.detailed("both tessera-scheduler replicas Ready, one leading", c.schedulersReady)
	_ = c.r.detailed("without NVML the agent exits 3 (allowNoGPU false), and doctor says why", c.agentCrashLoops)
	_ = c.r.detailed("the policies refuse a forged assignment on the real API server", c.forgedAssignment)
	_ = c.r.detailed("the policies refuse a forged inventory", c.forgedInventory)
	_ = c.r.detailed("the policies refuse a GPU pod naming spec.nodeName", c.pinnedGPUPod)
	_ = c.r.detailed("the claim webhook, called through its Service, refuses a default-scheduler pod's gpu.tessera.dev claim", c.claimWebhook)
	_ = c.r.detailed("a CPU pod placed by tessera-scheduler runs", c.cpuPod)
	_ = c.r.detailed("a GPU pod waits with the scheduler's reason on a node without GPUs", c.gpuPodPending)
	_ = c.r.detailed("the leader's pod deleted: the other replica takes over", c.takeover)
	_ = c.r.detailed("helm upgrade (agent.allowNoGPU=true, scheduler.extraArgs) rolls both; the agent serves an empty node, and doctor says why", c.upgradeNoGPU)
	_ = c.r.detailed("metrics scraped through the Services (kube-proxy)", c.metrics)
	_ = c.r.detailed("helm uninstall leaves only what the uninstall guide lists", c.uninstall)
	return nil
}

// network lists the node's links: a veth whose peer were in another
// namespace (the host's) would show a link-netnsid; and the resolver
// kubelet gives pods.
func (c *checks) network() (string, error) {
	out, err := exec.CommandContext(c.ctx, "ip", "-o", "-d", "link").Output()
	if err != nil {
		return "", err
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if strings.Contains(l, "link-netnsid") || strings.Contains(l, "link-netns ") {
			return "", fmt.Errorf("link %s leads to another network namespace: %s", name, l)
		}
		names = append(names, name)
	}
	routes, err := exec.CommandContext(c.ctx, "ip", "route", "get", "192.0.2.1").Output()
	if err != nil {
		return "", err
	}
	resolv, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	if strings.Contains(string(resolv), "nameserver") {
		return "", fmt.Errorf("the node's /etc/resolv.conf names a server: %s", resolv)
	}
	return fmt.Sprintf("links: %s, no peer outside; an address off the machine: %s; /etc/resolv.conf and kubelet's resolvConf: no nameserver",
		strings.Join(names, ", "), strings.TrimSpace(strings.Split(string(routes), "\n")[0])), nil
}

func (c *checks) nodeReady() (string, error) {
	var ready *v1.Node
	err := poll(c.ctx, 2*time.Minute, "node Ready", func() (bool, string) {
		n, err := c.client.CoreV1().Nodes().Get(c.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == v1.NodeReady {
				ready = n
				return cond.Status == v1.ConditionTrue, cond.Reason + ": " + cond.Message
			}
		}
		return false, "no Ready condition"
	})
	if err != nil {
		return "", err
	}
	// The label NVIDIA's GPU feature discovery puts on GPU nodes: the
	// chart's agent DaemonSet runs where it is.
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, gpuLabel)
	if _, err := c.client.CoreV1().Nodes().Patch(c.ctx, nodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return "", err
	}
	return fmt.Sprintf("kubelet %s, %s, %s CPU; labelled %s=true", ready.Status.NodeInfo.KubeletVersion,
		ready.Status.NodeInfo.ContainerRuntimeVersion, ready.Status.Capacity.Cpu(), gpuLabel), nil
}

// helm runs the Helm built from hack/tools/node against the cluster.
// It runs where make e2e-node runs, the repository's root, where the README's
// paths start.
func (c *checks) helm(args ...string) (string, error) {
	cmd := exec.CommandContext(c.ctx, filepath.Join(c.n.o.nodeBin, "helm"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.n.admin, "HELM_CACHE_HOME="+filepath.Join(c.n.scratch, "helm/cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.n.scratch, "helm/config"), "HELM_DATA_HOME="+filepath.Join(c.n.scratch, "helm/data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// install runs the command the README gives (deploy.InstallCommand, which
// make images prints), with the archives' registry and tag.
func (c *checks) install() (string, error) {
	command := deploy.InstallCommand(c.n.o.registry, c.tag)
	args := strings.Fields(strings.ReplaceAll(command, "\\\n", " "))
	if args[0] != "helm" {
		return "", fmt.Errorf("the README's install command is not helm's: %s", command)
	}
	if _, err := c.helm(args[1:]...); err != nil {
		return "", err
	}
	return strings.Join(args, " "), nil
}

func (c *checks) pods(selector string) ([]v1.Pod, error) {
	l, err := c.client.CoreV1().Pods(ns).List(c.ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var live []v1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live, nil
}

func ready(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// leader reads tessera-scheduler's leader Lease and returns its holder's pod
// name (the identity is the pod's hostname with a suffix).
func (c *checks) leader() (string, error) {
	l, err := c.client.CoordinationV1().Leases("kube-system").Get(c.ctx, scheduler, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", fmt.Errorf("lease kube-system/%s has no holder", scheduler)
	}
	id := *l.Spec.HolderIdentity
	if i := strings.Index(id, "_"); i > 0 {
		id = id[:i]
	}
	return id, nil
}

const schedulerSelector = "app.kubernetes.io/name=tessera-scheduler"

func (c *checks) schedulersReady() (string, error) {
	var detail string
	err := poll(c.ctx, 3*time.Minute, "two Ready tessera-scheduler pods and a leader among them", func() (bool, string) {
		pods, err := c.pods(schedulerSelector)
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for i := range pods {
			if ready(&pods[i]) {
				names = append(names, pods[i].Name)
			}
		}
		if len(names) != 2 {
			return false, fmt.Sprintf("%d of %d pods Ready", len(names), len(pods))
		}
		holder, err := c.leader()
		if err != nil {
			return false, err.Error()
		}
		if holder != names[0] && holder != names[1] {
			return false, "the lease's holder " + holder + " is not one of them"
		}
		detail = fmt.Sprintf("Ready: %s; leading: %s", strings.Join(names, ", "), holder)
		return true, ""
	})
	return detail, err
}

const agentSelector = "app.kubernetes.io/name=tessera-agent"

// doctor runs tessera doctor cluster and returns its output.
func (c *checks) doctor() string {
	out, _ := exec.CommandContext(c.ctx, c.n.o.tesseraBin, "doctor", "cluster", "--kubeconfig", c.n.admin,
		"--insecure-metrics").CombinedOutput()
	return string(out)
}

// finding returns the lines of doctor's output that mention want.
func finding(out, want string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, want) {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n")
}

func (c *checks) agentCrashLoops() (string, error) {
	var exit string
	err := poll(c.ctx, 3*time.Minute, "the agent's container to exit 3", func() (bool, string) {
		pods, err := c.pods(agentSelector)
		if err != nil || len(pods) != 1 {
			return false, fmt.Sprintf("%d agent pods (%v)", len(pods), err)
		}
		for _, s := range pods[0].Status.ContainerStatuses {
			if t := s.LastTerminationState.Terminated; t != nil {
				exit = fmt.Sprintf("pod %s: exit %d, restarts %d", pods[0].Name, t.ExitCode, s.RestartCount)
				return t.ExitCode == 3, exit
			}
			if t := s.State.Terminated; t != nil {
				exit = fmt.Sprintf("pod %s: exit %d", pods[0].Name, t.ExitCode)
				return t.ExitCode == 3, exit
			}
		}
		return false, "not ended yet"
	})
	if err != nil {
		return "", err
	}
	var said string
	err = poll(c.ctx, time.Minute, "doctor cluster to say the agent crash-loops with exit 3", func() (bool, string) {
		out := c.doctor()
		said = finding(out, "exit 3")
		return said != "", out
	})
	return exit + "\ndoctor: " + said, err
}

// refused wants a request's error to be the named policy's (or webhook's)
// refusal, with a message containing want; it returns the refusal.
func refused(err error, policy, want string) (string, error) {
	switch {
	case err == nil:
		return "", fmt.Errorf("accepted; want %s to refuse it", policy)
	case !strings.Contains(err.Error(), policy) || !strings.Contains(err.Error(), want):
		return "", fmt.Errorf("refused, but not by %s saying %q: %v", policy, want, err)
	}
	return err.Error(), nil
}

// asTenant is a user with the rights a team's developer has in its namespace
// and patch on nodes, so that only the policies stand between it and a
// forgery.
func (c *checks) asTenant() (kubernetes.Interface, error) {
	if c.tenant != nil {
		return c.tenant, nil
	}
	if _, err := c.client.CoreV1().Namespaces().Create(c.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-tenant"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"*"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
	}}
	if _, err := c.client.RbacV1().ClusterRoles().Create(c.ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-tenant"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: tenantUser}}}
	if _, err := c.client.RbacV1().ClusterRoleBindings().Create(c.ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(playground.As(c.admin, tenantUser, nil))
	c.tenant = cs
	return cs, err
}

// gpuPod is a pod asking a slice of a GPU from tessera-scheduler.
func gpuPod(name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tenant},
		Spec: v1.PodSpec{SchedulerName: scheduler, Containers: []v1.Container{{
			Name: "main", Image: pauseImage, ImagePullPolicy: v1.PullNever,
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				gpu.ResourceGPU: resource.MustParse("1"), gpu.ResourceMemory: resource.MustParse("8192"), gpu.ResourceCores: resource.MustParse("25"),
			}},
		}}},
	}
}

func (c *checks) forgedAssignment() (string, error) {
	cs, err := c.asTenant()
	if err != nil {
		return "", err
	}
	p := gpuPod("forged")
	p.Annotations = map[string]string{gpu.AnnotationAssignment: `{"v":"v1","node":"` + nodeName + `","containers":[{"name":"main","gpus":[{"uuid":"GPU-forged","memoryMiB":81920,"cores":1000}],"mode":"exclusive"}]}`}
	_, err = cs.CoreV1().Pods(tenant).Create(c.ctx, p, metav1.CreateOptions{})
	return refused(err, "tessera-scheduler-annotations", "may not be created with tessera.dev/assignment")
}

func (c *checks) forgedInventory() (string, error) {
	cs, err := c.asTenant()
	if err != nil {
		return "", err
	}
	inv := `{"node":"` + nodeName + `","gpus":[{"uuid":"GPU-forged","model":"H100","memoryMiB":81920}]}`
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, gpu.AnnotationInventory, inv)
	_, err = cs.CoreV1().Nodes().Patch(c.ctx, nodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return refused(err, "tessera-node-inventory", "only tessera-agent ("+deploy.AgentUser+") on node "+nodeName+" may write its tessera.dev/inventory, not "+tenantUser)
}

func (c *checks) pinnedGPUPod() (string, error) {
	cs, err := c.asTenant()
	if err != nil {
		return "", err
	}
	p := gpuPod("pinned")
	p.Spec.NodeName = nodeName
	_, err = cs.CoreV1().Pods(tenant).Create(c.ctx, p, metav1.CreateOptions{})
	return refused(err, "tessera-gpu-pod-node-name", "which skips tessera-scheduler")
}

// claimWebhook creates, as the administrator, a pod whose claim template
// asks gpu.tessera.dev while it names kube-scheduler: the API server calls
// the webhook the scheduler replicas serve, through its Service. Until the
// replicas have put their CA in the configuration the API server admits
// (failurePolicy Ignore), so an admitted pod is deleted and tried again.
func (c *checks) claimWebhook() (string, error) {
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "slice", Namespace: tenant},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}}}}}}}
	if _, err := c.client.ResourceV1().ResourceClaimTemplates(tenant).Create(c.ctx, tmpl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	var refusal error
	err := poll(c.ctx, time.Minute, "the webhook's refusal", func() (bool, string) {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-default-%d", time.Now().UnixNano()), Namespace: tenant},
			Spec: v1.PodSpec{SchedulerName: "default-scheduler", ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl.Name}},
				Containers: []v1.Container{{Name: "main", Image: pauseImage, ImagePullPolicy: v1.PullNever}}}}
		_, refusal = c.client.CoreV1().Pods(tenant).Create(c.ctx, p, metav1.CreateOptions{})
		if refusal == nil {
			_ = c.client.CoreV1().Pods(tenant).Delete(c.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			return false, "admitted"
		}
		return true, ""
	})
	if err != nil {
		return "", err
	}
	return refused(refusal, `admission webhook "claims.gpu.tessera.dev" denied the request`, `names spec.schedulerName "default-scheduler": set it to tessera-scheduler`)
}

func (c *checks) cpuPod() (string, error) {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: tenant},
		Spec: v1.PodSpec{SchedulerName: scheduler, Containers: []v1.Container{{
			Name: "main", Image: pauseImage, ImagePullPolicy: v1.PullNever,
			Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("10m")}},
		}}},
	}
	if _, err := c.client.CoreV1().Pods(tenant).Create(c.ctx, p, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	var detail string
	err := poll(c.ctx, 2*time.Minute, "the CPU pod Running", func() (bool, string) {
		got, err := c.client.CoreV1().Pods(tenant).Get(c.ctx, "cpu", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		detail = fmt.Sprintf("on %s, %s, IP %s", got.Spec.NodeName, got.Status.Phase, got.Status.PodIP)
		return got.Status.Phase == v1.PodRunning, detail
	})
	if err != nil {
		return "", err
	}
	events, err := c.client.CoreV1().Events(tenant).List(c.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=cpu,reason=Scheduled"})
	if err != nil {
		return "", err
	}
	for _, e := range events.Items {
		if e.ReportingController == scheduler || e.Source.Component == scheduler {
			return detail + "; Scheduled by " + scheduler + ": " + e.Message, nil
		}
	}
	return "", fmt.Errorf("%s; no Scheduled event from %s", detail, scheduler)
}

func (c *checks) gpuPodPending() (string, error) {
	if _, err := c.client.CoreV1().Pods(tenant).Create(c.ctx, gpuPod("gpu"), metav1.CreateOptions{}); err != nil {
		return "", err
	}
	var msg string
	err := poll(c.ctx, time.Minute, "the GPU pod unschedulable with a reason", func() (bool, string) {
		got, err := c.client.CoreV1().Pods(tenant).Get(c.ctx, "gpu", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
				msg = cond.Message
				return true, ""
			}
		}
		return false, fmt.Sprintf("phase %s, node %q", got.Status.Phase, got.Spec.NodeName)
	})
	return "Unschedulable: " + msg, err
}

func (c *checks) takeover() (string, error) {
	before, err := c.leader()
	if err != nil {
		return "", err
	}
	if err := c.client.CoreV1().Pods(ns).Delete(c.ctx, before, metav1.DeleteOptions{}); err != nil {
		return "", err
	}
	started := time.Now()
	var after string
	err = poll(c.ctx, 2*time.Minute, "another replica leading", func() (bool, string) {
		after, err = c.leader()
		if err != nil {
			return false, err.Error()
		}
		return after != before, "still " + after
	})
	return fmt.Sprintf("%s deleted; %s leads %.1f s later", before, after, time.Since(started).Seconds()), err
}

func (c *checks) upgradeNoGPU() (string, error) {
	old, err := c.pods(agentSelector)
	if err != nil || len(old) != 1 {
		return "", fmt.Errorf("want one agent pod before the upgrade: %d (%v)", len(old), err)
	}
	oldSchedulers, err := c.pods(schedulerSelector)
	if err != nil {
		return "", err
	}
	wasScheduler := map[types.UID]bool{}
	for _, p := range oldSchedulers {
		wasScheduler[p.UID] = true
	}
	if _, err := c.helm("upgrade", "tessera", c.n.o.chart, "-n", ns, "--reuse-values",
		"--set", "agent.allowNoGPU=true", "--set-json", `scheduler.extraArgs=["--v=3"]`); err != nil {
		return "", err
	}
	// The scheduler's Deployment rolls too (its flags changed): two new
	// replicas, given the extra flag last, one leading.
	var rolled string
	err = poll(c.ctx, 3*time.Minute, "two new tessera-scheduler replicas Ready, one leading", func() (bool, string) {
		pods, err := c.pods(schedulerSelector)
		if err != nil {
			return false, err.Error()
		}
		var fresh []string
		for i := range pods {
			if wasScheduler[pods[i].UID] {
				return false, "old replica " + pods[i].Name + " still runs"
			}
			if args := pods[i].Spec.Containers[0].Args; len(args) == 0 || args[len(args)-1] != "--v=3" {
				return false, fmt.Sprintf("replica %s runs with %q, not the extra flag last", pods[i].Name, args)
			}
			if ready(&pods[i]) {
				fresh = append(fresh, pods[i].Name)
			}
		}
		if len(fresh) != 2 {
			return false, fmt.Sprintf("%d new replicas Ready", len(fresh))
		}
		holder, err := c.leader()
		if err != nil || (holder != fresh[0] && holder != fresh[1]) {
			return false, fmt.Sprintf("leader %q (%v)", holder, err)
		}
		rolled = fmt.Sprintf("tessera-scheduler rolled to %s (extraArgs --v=3 last), %s leading", strings.Join(fresh, ", "), holder)
		return true, ""
	})
	if err != nil {
		return "", err
	}
	var detail string
	err = poll(c.ctx, 3*time.Minute, "a new agent pod Ready", func() (bool, string) {
		pods, err := c.pods(agentSelector)
		if err != nil || len(pods) != 1 {
			return false, fmt.Sprintf("%d agent pods (%v)", len(pods), err)
		}
		p := pods[0]
		if p.UID == old[0].UID {
			return false, "the old pod still runs"
		}
		detail = fmt.Sprintf("agent pod %s replaced by %s", old[0].Name, p.Name)
		return ready(&p), detail + ", not Ready yet"
	})
	if err != nil {
		return "", err
	}
	// Ready is not enough: a crash-looping agent is Ready between crashes.
	time.Sleep(15 * time.Second)
	pods, err := c.pods(agentSelector)
	if err != nil || len(pods) != 1 {
		return "", fmt.Errorf("%d agent pods (%v)", len(pods), err)
	}
	for _, s := range pods[0].Status.ContainerStatuses {
		if s.RestartCount > 0 || !s.Ready {
			return "", fmt.Errorf("%s: the agent restarted %d times, ready %v", detail, s.RestartCount, s.Ready)
		}
	}
	var said string
	err = poll(c.ctx, time.Minute, "doctor cluster to say the node serves no GPU, and why", func() (bool, string) {
		out := c.doctor()
		said = finding(out, "serves no GPU")
		return said != "", out
	})
	return rolled + "\n" + detail + ", Ready, no restart in 15 s\ndoctor: " + said, err
}

// metrics reads each component's metrics through its Service's cluster IP,
// which only kube-proxy's rules lead to a pod.
func (c *checks) metrics() (string, error) {
	client, err := c.n.adminHTTP()
	if err != nil {
		return "", err
	}
	scrape := func(url, want string) (int, error) {
		var series int
		err := poll(c.ctx, time.Minute, "GET "+url, func() (bool, string) {
			resp, err := client.Get(url)
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			series = 0
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, want) {
					series++
				}
			}
			return resp.StatusCode == http.StatusOK && series > 0, fmt.Sprintf("%s, %d %s series", resp.Status, series, want)
		})
		return series, err
	}
	var lines []string
	// tessera-scheduler's Service has a cluster IP: kube-proxy's rules lead
	// it to one replica.
	svc, err := c.client.CoreV1().Services(ns).Get(c.ctx, "tessera-scheduler-metrics", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	url := fmt.Sprintf("https://%s:10259/metrics", svc.Spec.ClusterIP)
	n, err := scrape(url, "tessera_")
	if err != nil {
		return "", err
	}
	lines = append(lines, fmt.Sprintf("tessera-scheduler-metrics, cluster IP (%s): %d tessera_* samples", url, n))
	// The agents' Service is headless, one target per agent, as Prometheus
	// finds them: its EndpointSlices.
	slices, err := c.client.DiscoveryV1().EndpointSlices(ns).List(c.ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=tessera-agent-metrics"})
	if err != nil {
		return "", err
	}
	for _, sl := range slices.Items {
		for _, e := range sl.Endpoints {
			for _, addr := range e.Addresses {
				url := fmt.Sprintf("http://%s:9401/metrics", addr)
				n, err := scrape(url, "tessera_")
				if err != nil {
					return "", err
				}
				lines = append(lines, fmt.Sprintf("tessera-agent-metrics, headless, endpoint %s: %d tessera_* samples", url, n))
			}
		}
	}
	if len(lines) < 2 {
		return "", fmt.Errorf("the Service tessera-agent-metrics has no endpoint")
	}
	// kube-proxy's rules, here in the node's network namespace only (the
	// host check shows none survive on the host).
	if dump, err := exec.CommandContext(c.ctx, "iptables-save").Output(); err == nil {
		rules := 0
		for _, l := range strings.Split(string(dump), "\n") {
			if strings.HasPrefix(l, "-A KUBE-") {
				rules++
			}
		}
		lines = append(lines, fmt.Sprintf("kube-proxy's rules in the node's namespace: %d", rules))
	}
	return strings.Join(lines, "\n"), nil
}

// uninstall runs helm uninstall and lists what of Tessera remains, against
// what the uninstall guide (docs/operations.md#uninstalling) says stays: the
// node's inventory annotation, the agents' heartbeat Leases and preemption
// records in the namespace, the namespace itself, and the scheduler's
// leader Lease.
func (c *checks) uninstall() (string, error) {
	if _, err := c.helm("uninstall", "tessera", "-n", ns, "--wait", "--timeout", "2m"); err != nil {
		return "", err
	}
	var left, expected []string
	err := poll(c.ctx, 90*time.Second, "only what the guide lists left", func() (bool, string) {
		var err error
		left, expected, err = c.leftovers()
		if err != nil {
			return false, err.Error()
		}
		return len(left) == 0, "not in the guide: " + strings.Join(left, ", ")
	})
	return "left, as the guide says: " + strings.Join(expected, ", "), err
}

// leftovers sorts what of Tessera is in the cluster into what the uninstall
// guide lists and what it does not: every object in Tessera's namespace but
// those each namespace has, every object named for Tessera in kube-system
// and cluster-wide, the chart's priority classes, and the node's tessera.dev
// annotations and labels.
func (c *checks) leftovers() (unexpected, expected []string, err error) {
	dyn, err := dynamic.NewForConfig(c.admin)
	if err != nil {
		return nil, nil, err
	}
	note := func(what string, listed bool) {
		if listed {
			expected = append(expected, what)
		} else {
			unexpected = append(unexpected, what)
		}
	}
	everyNamespaceHas := map[string]bool{"configmap/kube-root-ca.crt": true, "serviceaccount/default": true}
	gvr := func(group, version, resource string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: group, Version: version, Resource: resource}
	}
	namespaced := []schema.GroupVersionResource{
		gvr("", "v1", "pods"), gvr("", "v1", "configmaps"), gvr("", "v1", "secrets"), gvr("", "v1", "services"),
		gvr("", "v1", "serviceaccounts"), gvr("apps", "v1", "deployments"), gvr("apps", "v1", "daemonsets"),
		gvr("policy", "v1", "poddisruptionbudgets"), gvr("coordination.k8s.io", "v1", "leases"),
		gvr("rbac.authorization.k8s.io", "v1", "roles"), gvr("rbac.authorization.k8s.io", "v1", "rolebindings"),
	}
	for _, r := range namespaced {
		for _, namespace := range []string{ns, "kube-system"} {
			l, err := dyn.Resource(r).Namespace(namespace).List(c.ctx, metav1.ListOptions{})
			if err != nil {
				return nil, nil, fmt.Errorf("listing %s in %s: %w", r.Resource, namespace, err)
			}
			for _, x := range l.Items {
				kind := strings.TrimSuffix(r.Resource, "s")
				switch {
				case namespace == "kube-system" && !strings.Contains(x.GetName(), "tessera"):
				case namespace == "kube-system":
					note(kind+" kube-system/"+x.GetName(), kind == "lease" && x.GetName() == scheduler)
				case everyNamespaceHas[kind+"/"+x.GetName()]:
				default:
					note(kind+" "+ns+"/"+x.GetName(), kind == "lease" && strings.HasPrefix(x.GetName(), "tessera-agent-") ||
						kind == "configmap" && x.GetLabels()["tessera.dev/preemption-record"] == "true")
				}
			}
		}
	}
	cluster := []schema.GroupVersionResource{
		gvr("rbac.authorization.k8s.io", "v1", "clusterroles"), gvr("rbac.authorization.k8s.io", "v1", "clusterrolebindings"),
		gvr("scheduling.k8s.io", "v1", "priorityclasses"), gvr("resource.k8s.io", "v1", "deviceclasses"),
		gvr("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies"),
		gvr("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings"),
		gvr("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations"),
	}
	for _, r := range cluster {
		l, err := dyn.Resource(r).List(c.ctx, metav1.ListOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("listing %s: %w", r.Resource, err)
		}
		for _, x := range l.Items {
			if strings.Contains(x.GetName(), "tessera") || r.Resource == "priorityclasses" && strings.HasPrefix(x.GetName(), "gpu-") {
				note(strings.TrimSuffix(r.Resource, "s")+" "+x.GetName(), false)
			}
		}
	}
	if _, err := c.client.CoreV1().Namespaces().Get(c.ctx, ns, metav1.GetOptions{}); err == nil {
		note("namespace "+ns, true)
	}
	node, err := c.client.CoreV1().Nodes().Get(c.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	for k := range node.Annotations {
		if strings.HasPrefix(k, "tessera.dev/") {
			note("node annotation "+k, k == gpu.AnnotationInventory)
		}
	}
	for k := range node.Labels {
		if strings.HasPrefix(k, "tessera.dev/") {
			note("node label "+k, false)
		}
	}
	return unexpected, expected, nil
}
