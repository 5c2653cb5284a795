package doctor

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/agentendpoint"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// ClusterOptions say where Tessera runs and what to read besides the API
// server.
type ClusterOptions struct {
	// Namespace is Tessera's (tessera-system): the agents' heartbeats and
	// the components' pods.
	Namespace string
	// LeaseNamespace holds tessera-scheduler's leader Lease (kube-system).
	LeaseNamespace string
	// SchedulerMetrics and AgentMetrics are metrics URLs to read (the
	// playground prints them); without them the agents are read through
	// the API server's pod proxy and the scheduler's latency is not.
	SchedulerMetrics string
	AgentMetrics     []string
	// HTTP reads the metrics URLs.
	HTTP *http.Client
	// Now is the time the checks judge ages by.
	Now time.Time
	// PendingFor is how long a GPU pod may wait before it is a warning.
	PendingFor time.Duration
	// StallThreshold is the stall ratio above which a GPU is reported
	// (the write-up's 15 %).
	StallThreshold float64
}

// Policies are the admission policies Tessera ships (deploy/admission-policies.yaml).
var Policies = []string{"tessera-scheduler-annotations", "tessera-checkpointed", "tessera-gpu-pod-limits", "tessera-gpu-pod-node-name", "tessera-node-inventory",
	"tessera-gpu-pod-scheduler", "tessera-pod-binding", "tessera-gpu-pod-status", "tessera-agent-node-bound", "tessera-gpu-priority"}

// ClusterFacts is what the cluster checks judge.
type ClusterFacts struct {
	// ServerVersion is the API server's gitVersion ("v1.37.2");
	// VersionErr says why it is unknown.
	ServerVersion string
	VersionErr    error
	Nodes         []v1.Node
	Pods          []v1.Pod
	Events        []v1.Event
	Leases        []coordinationv1.Lease // Tessera's namespace and the scheduler's
	ListErrs      []error
	Policies      map[string]bool // name → a binding refers to it
	PolicyErr     error
	// AdmissionConfigErr says why the policies' ConfigMap could not be
	// read (NotFound when it is missing).
	AdmissionConfigErr error
	// SchedulerMetrics is the scheduler's metric families, nil when not
	// read; SchedulerErr says why.
	SchedulerMetrics map[string]*dto.MetricFamily
	SchedulerErr     error
	// Stalls are per GPU UUID (with its node) the agents' stall ratio.
	Stalls    []GPUStall
	AgentsErr error
	// ResourceSlices are the DRA driver's (gpu.tessera.dev) slices; nil
	// where the cluster has no resource.k8s.io API.
	ResourceSlices []resourceapi.ResourceSlice
}

// GPUStall is one GPU's tessera_gpu_stall_ratio.
type GPUStall struct {
	Node, GPU string
	Ratio     float64
}

// GatherCluster reads the cluster's facts.
func GatherCluster(ctx context.Context, client kubernetes.Interface, o ClusterOptions) ClusterFacts {
	var f ClusterFacts
	if v, err := client.Discovery().ServerVersion(); err != nil {
		f.VersionErr = err
	} else {
		f.ServerVersion = v.GitVersion
	}
	if nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		f.ListErrs = append(f.ListErrs, fmt.Errorf("list nodes: %w", err))
	} else {
		f.Nodes = nodes.Items
	}
	if pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err != nil {
		f.ListErrs = append(f.ListErrs, fmt.Errorf("list pods: %w", err))
	} else {
		f.Pods = pods.Items
	}
	if evs, err := client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err != nil {
		f.ListErrs = append(f.ListErrs, fmt.Errorf("list events: %w", err))
	} else {
		f.Events = evs.Items
	}
	for _, ns := range []string{o.Namespace, o.LeaseNamespace} {
		if ls, err := client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{}); err == nil {
			f.Leases = append(f.Leases, ls.Items...)
		} else {
			f.ListErrs = append(f.ListErrs, fmt.Errorf("list leases in %s: %w", ns, err))
		}
	}
	if sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + gpu.DRADriver}); err == nil {
		f.ResourceSlices = sl.Items
	} else if !apierrors.IsNotFound(err) {
		f.ListErrs = append(f.ListErrs, fmt.Errorf("list resourceslices: %w", err))
	}
	f.Policies = map[string]bool{}
	if ps, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{}); err != nil {
		f.PolicyErr = err
	} else {
		for _, p := range ps.Items {
			f.Policies[p.Name] = false
		}
		if bs, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{}); err != nil {
			f.PolicyErr = err
		} else {
			for _, b := range bs.Items {
				if _, ok := f.Policies[b.Spec.PolicyName]; ok {
					f.Policies[b.Spec.PolicyName] = true
				}
			}
		}
	}
	if len(f.Policies) > 0 {
		_, f.AdmissionConfigErr = client.CoreV1().ConfigMaps(o.Namespace).Get(ctx, deploy.AdmissionConfigMap, metav1.GetOptions{})
	}
	httpc := o.HTTP
	if httpc == nil {
		httpc = &http.Client{Timeout: 10 * time.Second}
	}
	if o.SchedulerMetrics != "" {
		var m agentendpoint.Metrics
		if m, f.SchedulerErr = agentendpoint.FromURL(ctx, httpc, o.SchedulerMetrics); f.SchedulerErr == nil {
			f.SchedulerMetrics = m.Families
		}
	}
	var errs []error
	var agents []agentendpoint.Metrics
	if len(o.AgentMetrics) > 0 {
		for _, u := range o.AgentMetrics {
			m, err := agentendpoint.FromURL(ctx, httpc, u)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			agents = append(agents, m)
		}
	} else {
		var err error
		agents, err = agentendpoint.FromPods(ctx, client, o.Namespace)
		errs = append(errs, err)
	}
	for _, a := range agents {
		for _, m := range a.Families["tessera_gpu_stall_ratio"].GetMetric() {
			l := agentendpoint.Labels(m)
			f.Stalls = append(f.Stalls, GPUStall{Node: l["node"], GPU: l["UUID"], Ratio: m.GetGauge().GetValue()})
		}
	}
	f.AgentsErr = errors.Join(errs...)
	return f
}

// ClusterChecks are the cluster checks over facts already gathered.
func ClusterChecks(f ClusterFacts, o ClusterOptions) []Check {
	pure := func(id string, fn func(ClusterFacts, ClusterOptions) []Finding) Check {
		return Check{ID: id, Run: func(context.Context) []Finding { return fn(f, o) }}
	}
	return []Check{
		pure("api", checkAPI),
		pure("version", checkVersion),
		pure("scheduler", checkScheduler),
		pure("agents", checkAgents),
		pure("dra", checkDRA),
		pure("pending", checkPending),
		pure("refused", checkRefused),
		pure("oom", checkOOM),
		pure("stall", checkStall),
		pure("policies", checkPolicies),
	}
}

// DiagnoseCluster gathers a cluster's facts and runs every cluster check.
func DiagnoseCluster(ctx context.Context, client kubernetes.Interface, o ClusterOptions, timeout time.Duration) []Finding {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	if o.PendingFor == 0 {
		o.PendingFor = 5 * time.Minute
	}
	if o.StallThreshold == 0 {
		o.StallThreshold = 0.15
	}
	gctx, cancel := context.WithTimeout(ctx, 3*timeout)
	defer cancel()
	return Run(ctx, ClusterChecks(GatherCluster(gctx, client, o), o), timeout)
}

func checkAPI(f ClusterFacts, _ ClusterOptions) []Finding {
	var out []Finding
	for _, err := range f.ListErrs {
		out = append(out, Finding{ID: "api.read", Severity: Warning, Summary: "part of the cluster could not be read, so checks that need it say less",
			Evidence: err.Error(), Remedy: "Run the doctor as a user who may get and list nodes, pods, events and leases (cluster-wide)."})
	}
	return out
}

// minKubernetes is the chart's kubeVersion: ValidatingAdmissionPolicy v1
// with the CEL the shipped policies use, and the kubelet device-plugin API
// v1beta1 (the write-up's 1.24 is not enough).
var minKubernetes = [2]int{1, 34}

func checkVersion(f ClusterFacts, _ ClusterOptions) []Finding {
	if f.VersionErr != nil {
		return []Finding{{ID: "version.kubernetes", Severity: Warning, Summary: "the API server's version could not be read", Evidence: f.VersionErr.Error()}}
	}
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(f.ServerVersion, "v"), "%d.%d", &major, &minor); err != nil {
		return []Finding{{ID: "version.kubernetes", Severity: Warning, Summary: "the API server's version is not one the doctor reads", Evidence: f.ServerVersion}}
	}
	if major == 0 {
		// A build without release stamps (kube-apiserver run from Go
		// modules, as the playground does) reports v0.0.0.
		return []Finding{{ID: "version.kubernetes", Severity: Info, Summary: "the API server reports no release version (an unstamped build), so it was not checked", Evidence: f.ServerVersion}}
	}
	if major < minKubernetes[0] || major == minKubernetes[0] && minor < minKubernetes[1] {
		return []Finding{{ID: "version.kubernetes", Severity: Error, Summary: fmt.Sprintf("Kubernetes %d.%d is older than %d.%d, which Tessera needs", major, minor, minKubernetes[0], minKubernetes[1]),
			Evidence: f.ServerVersion, Remedy: "Upgrade the cluster: the shipped admission policies need ValidatingAdmissionPolicy v1 and the CEL of 1.34 (helm refuses the chart below its kubeVersion)."}}
	}
	return []Finding{pass("version.kubernetes", "", "Kubernetes "+f.ServerVersion, f.ServerVersion)}
}

func checkScheduler(f ClusterFacts, o ClusterOptions) []Finding {
	var out []Finding
	seen := false
	for _, l := range f.Leases {
		if l.Name != "tessera-scheduler" || l.Namespace != o.LeaseNamespace {
			continue
		}
		seen = true
		age, holder := leaseAge(l, o.Now)
		switch {
		case age > leaseDuration(l, 15*time.Second)*2:
			out = append(out, Finding{ID: "scheduler.leader", Severity: Error, Summary: fmt.Sprintf("tessera-scheduler's leader lease was last renewed %v ago: no replica leads, GPU pods are not placed", age.Round(time.Second)),
				Evidence: "holder " + holder, Remedy: "kubectl -n " + o.Namespace + " get pods -l app.kubernetes.io/name=tessera-scheduler; read the replicas' logs for leader election errors."})
		default:
			out = append(out, pass("scheduler.leader", "", "tessera-scheduler leads: "+holder, fmt.Sprintf("renewed %v ago", age.Round(time.Second))))
		}
	}
	running := 0
	for _, p := range f.Pods {
		if p.Namespace == o.Namespace && p.Labels["app.kubernetes.io/name"] == "tessera-scheduler" && p.Status.Phase == v1.PodRunning {
			running++
		}
	}
	if running > 0 {
		out = append(out, pass("scheduler.pods", "", fmt.Sprintf("%d tessera-scheduler pod(s) running", running), ""))
	}
	if f.SchedulerMetrics != nil {
		seen = true
		if p99, n, ok := histogramQuantile(f.SchedulerMetrics["scheduler_scheduling_attempt_duration_seconds"], 0.99); ok {
			sev, remedy := OK, ""
			if p99 > 1 {
				sev, remedy = Warning, "Scheduling is slow: look at the pending reasons below, the scheduler's CPU limit, and the percentageOfNodesToScore of its configuration; Tessera's plugin decides in microseconds per node (docs/benchmarks.md)."
			}
			out = append(out, Finding{ID: "scheduler.latency", Severity: sev, Summary: fmt.Sprintf("p99 scheduling attempt %s over %d attempts", fmtSeconds(p99), n),
				Evidence: "scheduler_scheduling_attempt_duration_seconds", Remedy: remedy})
		} else {
			out = append(out, pass("scheduler.latency", "", "no scheduling attempts yet", ""))
		}
	} else if f.SchedulerErr != nil {
		seen = true // a URL was given: its scheduler is not "not found"
		remedy := "Check the URL (tessera up prints it; in a cluster, the tessera-scheduler Service on port 10259, path /metrics) and that this machine reaches it."
		var unknownCA x509.UnknownAuthorityError
		var invalid x509.CertificateInvalidError
		if errors.As(f.SchedulerErr, &unknownCA) || errors.As(f.SchedulerErr, &invalid) || strings.Contains(f.SchedulerErr.Error(), "certificate") {
			remedy = "tessera-scheduler serves its metrics with a self-signed certificate by default: pass --insecure-metrics to read them anyway."
		}
		out = append(out, Finding{ID: "scheduler.latency", Severity: Warning, Summary: "the scheduler's metrics could not be read", Evidence: f.SchedulerErr.Error(), Remedy: remedy})
	}
	if !seen && running == 0 {
		out = append(out, Finding{ID: "scheduler.leader", Severity: Error, Summary: "tessera-scheduler was not found: no leader lease, no running pod, no metrics given",
			Remedy: "Install it (helm install … deploy/chart/tessera) or, for a scheduler outside the cluster (tessera up runs one in its process), pass --scheduler-metrics URL."})
	}
	return out
}

func leaseAge(l coordinationv1.Lease, now time.Time) (time.Duration, string) {
	holder := "nobody"
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime == nil {
		return time.Duration(math.MaxInt64), holder
	}
	return now.Sub(l.Spec.RenewTime.Time), holder
}

func leaseDuration(l coordinationv1.Lease, def time.Duration) time.Duration {
	if l.Spec.LeaseDurationSeconds != nil {
		return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return def
}

// histogramQuantile estimates q of a histogram family summed over its
// series, by linear interpolation within the bucket, as PromQL does.
func histogramQuantile(mf *dto.MetricFamily, q float64) (float64, uint64, bool) {
	if mf == nil {
		return 0, 0, false
	}
	counts := map[float64]uint64{}
	var total uint64
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		total += h.GetSampleCount()
		for _, b := range h.GetBucket() {
			counts[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	if total == 0 {
		return 0, 0, false
	}
	bounds := make([]float64, 0, len(counts))
	for b := range counts {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	rank := q * float64(total)
	lower, below := 0.0, uint64(0)
	for _, b := range bounds {
		c := counts[b]
		if float64(c) >= rank {
			if math.IsInf(b, 1) {
				return lower, total, true
			}
			if c == below {
				return b, total, true
			}
			return lower + (b-lower)*(rank-float64(below))/float64(c-below), total, true
		}
		lower, below = b, c
	}
	return lower, total, true
}

func fmtSeconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Microsecond).String()
}

// gpuNodes are the nodes that carry an inventory or the GPU label.
func gpuNodes(f ClusterFacts) []v1.Node {
	var out []v1.Node
	for _, n := range f.Nodes {
		if _, ok := n.Annotations[gpu.AnnotationInventory]; ok || n.Labels["nvidia.com/gpu.present"] == "true" {
			out = append(out, n)
		}
	}
	return out
}

// checkDRA looks at the nodes that serve their GPUs through the DRA
// driver: each has its ResourceSlice with every GPU, and a node labelled
// for DRA serves it.
func checkDRA(f ClusterFacts, o ClusterOptions) []Finding {
	devices := map[string]int{} // node → devices published
	published := map[string]bool{}
	for _, s := range f.ResourceSlices {
		if s.Spec.Driver == gpu.DRADriver && s.Spec.NodeName != nil {
			devices[*s.Spec.NodeName] += len(s.Spec.Devices)
			published[*s.Spec.NodeName] = true
		}
	}
	var out []Finding
	for _, n := range gpuNodes(f) {
		inv, err := inventory.FromNode(&n)
		if err != nil || inv == nil {
			continue // agents.inventory says why
		}
		labelled := n.Labels["tessera.dev/dra"] == "true"
		switch {
		case labelled && !inv.DRA:
			out = append(out, Finding{ID: "dra.node", Severity: Warning, Subject: n.Name,
				Summary:  "the node is labelled tessera.dev/dra=true but its agent serves the device plugin: claims cannot be placed there",
				Evidence: "the inventory does not say dra; the agent reads the label when it starts",
				Remedy: "Restart the node's agent (kubectl -n " + o.Namespace + " delete pod -l " + agentendpoint.Selector + " --field-selector spec.nodeName=" + n.Name +
					"); if it stays, the chart's agent.dra is never."})
		case !inv.DRA:
		case !published[n.Name]:
			out = append(out, Finding{ID: "dra.slice", Severity: Error, Subject: n.Name,
				Summary:  "the node serves its GPUs through DRA but publishes no gpu.tessera.dev ResourceSlice: no claim can be placed there, and no tessera.dev/gpu pod either",
				Evidence: fmt.Sprintf("%d GPU(s) in the inventory, no ResourceSlice with spec.nodeName=%s", len(inv.GPUs), n.Name),
				Remedy:   "Read the agent's log on the node (the DRA driver's start, its RBAC on resourceslices); kubectl get resourceslices --field-selector spec.nodeName=" + n.Name + "."})
		case devices[n.Name] != len(inv.GPUs):
			out = append(out, Finding{ID: "dra.slice", Severity: Warning, Subject: n.Name,
				Summary:  fmt.Sprintf("the node's ResourceSlice lists %d device(s), its inventory %d GPU(s)", devices[n.Name], len(inv.GPUs)),
				Evidence: "the agent republishes both on every change; a difference that stays means its publishing fails",
				Remedy:   "Read the agent's log on the node for 'Publishing the node's ResourceSlice failed'."})
		default:
			out = append(out, pass("dra.slice", n.Name, fmt.Sprintf("serves %d GPU(s) through DRA", len(inv.GPUs)), "ResourceSlice of "+gpu.DRADriver+" published"))
		}
	}
	return out
}

func checkAgents(f ClusterFacts, o ClusterOptions) []Finding {
	leases := map[string]coordinationv1.Lease{}
	for _, l := range f.Leases {
		if l.Namespace == o.Namespace {
			leases[l.Name] = l
		}
	}
	nodes := gpuNodes(f)
	if len(nodes) == 0 {
		return []Finding{{ID: "agents.present", Severity: Warning, Summary: "no GPU node: no node carries a Tessera inventory or the label nvidia.com/gpu.present=true",
			Remedy: "Label GPU nodes nvidia.com/gpu.present=true (NVIDIA's GPU feature discovery does) so tessera-agent runs there."}}
	}
	var out []Finding
	for _, n := range nodes {
		inv, err := inventory.FromNode(&n)
		switch {
		case err != nil:
			out = append(out, Finding{ID: "agents.inventory", Severity: Error, Subject: n.Name, Summary: "the node's GPU inventory is unreadable: the scheduler places nothing there",
				Evidence: err.Error(), Remedy: "The node's tessera-agent restores it within a second when it runs; if it stays, the agent is down (see agents.heartbeat)."})
		case inv == nil:
			out = append(out, Finding{ID: "agents.inventory", Severity: Error, Subject: n.Name, Summary: "a GPU node without a Tessera inventory: tessera-agent has not started there",
				Remedy: "kubectl -n " + o.Namespace + " get pods -o wide -l " + agentendpoint.Selector + "; the agent needs the NVIDIA runtime and the node's GPU label."})
			out = append(out, agentPod(f.Pods, o.Namespace, n.Name)...)
		case inv.NoGPU != "":
			out = append(out, Finding{ID: "agents.gpus", Severity: Warning, Subject: n.Name,
				Summary:  "the node's agent serves no GPU: NVML did not load, so it runs as an empty node (agent.allowNoGPU)",
				Evidence: inv.NoGPU,
				Remedy: "Install the NVIDIA driver and container toolkit on the node, or give the agent the runtime class that mounts the driver (agent.runtimeClassName); " +
					"if the node has no GPU, take the nvidia.com/gpu.present label off it. The agent finds the GPUs when it restarts."})
		}
		l, has := leases[inventory.HeartbeatName(n.Name)]
		if !has {
			if inv != nil {
				out = append(out, Finding{ID: "agents.heartbeat", Severity: Warning, Subject: n.Name, Summary: "the node's agent sends no heartbeat, so whether it still runs is unknown",
					Remedy: "Agents before this version send none; upgrade tessera-agent."})
			}
			continue
		}
		age, _ := leaseAge(l, o.Now)
		if age > leaseDuration(l, inventory.HeartbeatDuration) {
			out = append(out, Finding{ID: "agents.heartbeat", Severity: Error, Subject: n.Name,
				Summary:  fmt.Sprintf("tessera-agent has not been heard from for %v: its inventory is stale and starting GPU containers get no slots", age.Round(time.Second)),
				Evidence: fmt.Sprintf("lease %s/%s renewed %v", l.Namespace, l.Name, l.Spec.RenewTime),
				Remedy:   "kubectl -n " + o.Namespace + " get pods -o wide --field-selector spec.nodeName=" + n.Name + "; read the agent's log (NVML hung, API server unreachable) or restart it."})
			if inv != nil {
				out = append(out, agentPod(f.Pods, o.Namespace, n.Name)...)
			}
			continue
		}
		if inv != nil {
			out = append(out, pass("agents.heartbeat", n.Name, fmt.Sprintf("tessera-agent alive, %d GPU(s) published", len(inv.GPUs)), fmt.Sprintf("renewed %v ago", age.Round(time.Second))))
		}
	}
	return out
}

// agentPod says, for a node whose agent is not heard from, what its agent
// pod does: none there (the DaemonSet placed none), pending, or crashing
// with its last exit, told apart: a missing driver (exit 3), a bad flag or
// configuration (exit 2), anything else. Nothing when the pod runs ready
// (the heartbeat finding says the rest).
func agentPod(pods []v1.Pod, ns, node string) []Finding {
	sel, _ := labels.Parse(agentendpoint.Selector)
	var pod *v1.Pod
	for i := range pods {
		if p := &pods[i]; p.Namespace == ns && p.Spec.NodeName == node && sel.Matches(labels.Set(p.Labels)) && p.DeletionTimestamp == nil {
			pod = p
		}
	}
	if pod == nil {
		return []Finding{{ID: "agents.pod", Severity: Error, Subject: node,
			Summary: "no tessera-agent pod on the node: its DaemonSet placed none",
			Remedy:  "kubectl -n " + ns + " describe daemonset tessera-agent (its nodeSelector and tolerations against the node's labels and taints, and room on the node)."}}
	}
	describe := "kubectl -n " + ns + " describe pod " + pod.Name
	if pod.Status.Phase == v1.PodPending && len(pod.Status.ContainerStatuses) == 0 {
		why := pod.Status.Reason
		for _, c := range pod.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Message != "" {
				why = c.Message
			}
		}
		return []Finding{{ID: "agents.pod", Severity: Error, Subject: node, Summary: "the node's tessera-agent pod " + pod.Name + " is Pending", Evidence: why, Remedy: describe + "."}}
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.Ready {
			continue
		}
		last := c.LastTerminationState.Terminated
		if last == nil {
			last = c.State.Terminated
		}
		waiting := ""
		if c.State.Waiting != nil {
			waiting = c.State.Waiting.Reason
		}
		evidence := fmt.Sprintf("container %s: %d restarts", c.Name, c.RestartCount)
		if waiting != "" {
			evidence += ", " + waiting
		}
		logs := "kubectl -n " + ns + " logs " + pod.Name + " --previous"
		switch {
		case last == nil:
			return []Finding{{ID: "agents.pod", Severity: Error, Subject: node, Summary: "the node's tessera-agent pod " + pod.Name + " is not ready",
				Evidence: evidence, Remedy: describe + "."}}
		case last.ExitCode == 3:
			return []Finding{{ID: "agents.pod", Severity: Error, Subject: node,
				Summary:  "tessera-agent crash-loops on the node: exit 3, NVML did not load (no NVIDIA driver, or the runtime gives the agent none)",
				Evidence: evidence + ", last exit 3",
				Remedy:   "Install the NVIDIA driver and container toolkit there, or set the chart's agent.allowNoGPU=true to serve an empty node; " + logs + "."}}
		case last.ExitCode == 2:
			return []Finding{{ID: "agents.pod", Severity: Error, Subject: node,
				Summary:  "tessera-agent crash-loops on the node: exit 2, a bad flag or configuration",
				Evidence: evidence + ", last exit 2",
				Remedy:   logs + " names the flag or field; fix the chart's values (agent.extraArgs, the configuration)."}}
		default:
			return []Finding{{ID: "agents.pod", Severity: Error, Subject: node,
				Summary:  fmt.Sprintf("tessera-agent crash-loops on the node: exit %d", last.ExitCode),
				Evidence: fmt.Sprintf("%s, last exit %d (%s)", evidence, last.ExitCode, last.Reason),
				Remedy:   logs + "."}}
		}
	}
	return nil
}

// checkPending groups the GPU pods waiting for a slice by the scheduler's
// reason.
func checkPending(f ClusterFacts, o ClusterOptions) []Finding {
	type group struct {
		pods   []string
		oldest time.Duration
	}
	groups := map[string]*group{}
	for _, p := range f.Pods {
		if p.Spec.NodeName != "" || !podgpu.WantsGPU(&p) || podgpu.Finished(&p) || p.DeletionTimestamp != nil {
			continue
		}
		reason := "not tried yet"
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Message != "" {
				reason = pendingReason(c.Message)
			}
		}
		g := groups[reason]
		if g == nil {
			g = &group{}
			groups[reason] = g
		}
		g.pods = append(g.pods, p.Namespace+"/"+p.Name)
		g.oldest = max(g.oldest, o.Now.Sub(p.CreationTimestamp.Time))
	}
	var out []Finding
	for _, reason := range slices.Sorted(maps.Keys(groups)) {
		g := groups[reason]
		sort.Strings(g.pods)
		sev := Info
		if g.oldest > o.PendingFor {
			sev = Warning
		}
		out = append(out, Finding{ID: "pending.gpu-pods", Severity: sev, Subject: reason,
			Summary:  fmt.Sprintf("%d GPU pod(s) waiting, the oldest for %v", len(g.pods), g.oldest.Round(time.Second)),
			Evidence: strings.Join(g.pods[:min(5, len(g.pods))], " "),
			Remedy:   "The reason says what to change: a smaller slice, another sharing mode or GPU model, or more GPUs; `kubectl describe pod` has the full message."})
	}
	return out
}

// pendingReason is the part of the scheduler's message that is the same
// for every pod short of the same thing: "0/4 nodes are available: 4 no
// GPU with the memory and cores asked free. GPUs: largest …" → "no GPU
// with the memory and cores asked free".
func pendingReason(msg string) string {
	if _, rest, ok := strings.Cut(msg, "are available: "); ok {
		msg = rest
	}
	msg = strings.TrimLeft(msg, "0123456789 ")
	if i := strings.IndexAny(msg, ".;"); i > 0 {
		msg = msg[:i]
	}
	if len(msg) > 120 {
		msg = msg[:120] + "…"
	}
	return msg
}

// checkRefused finds GPU pods whose containers the agent refused: the
// write-up's "pod stuck in ContainerCreating".
func checkRefused(f ClusterFacts, _ ClusterOptions) []Finding {
	why := map[string]string{}
	for _, e := range f.Events {
		if e.Reason == "GPUSlotsRefused" && e.InvolvedObject.Kind == "Pod" {
			why[e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name] = e.Message
		}
	}
	var out []Finding
	for _, p := range f.Pods {
		if p.Spec.NodeName == "" || !podgpu.WantsGPU(&p) || podgpu.Finished(&p) || p.Status.Phase == v1.PodRunning {
			continue
		}
		key := p.Namespace + "/" + p.Name
		msg := why[key]
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && strings.Contains(w.Message, "PreStartContainer") {
				msg = w.Message
			}
		}
		if msg == "" {
			continue
		}
		out = append(out, Finding{ID: "refused.gpu-pods", Severity: Error, Subject: key, Summary: "the node's tessera-agent refuses the pod its GPUs; it does not start",
			Evidence: msg,
			Remedy:   "The message says why: a pod not placed by tessera-scheduler (no assignment, another schedulerName) must be recreated through it; a limit that could not be set points at the node (tessera doctor node)."})
	}
	return out
}

// oomMarks are how CUDA's out-of-memory shows in a container's message.
var oomMarks = []string{"CUDA_ERROR_OUT_OF_MEMORY", "CUDA out of memory", "cudaErrorMemoryAllocation", "out of memory"}

// checkOOM matches GPU containers that ran out of GPU memory — by their
// termination message, or an event on their pod — with the slice they were
// given and what held it.
func checkOOM(f ClusterFacts, _ ClusterOptions) []Finding {
	// Events name the pod, and the container in their field path
	// ("spec.containers{main}") when they know it.
	type podKey struct{ ns, name string }
	evOOM := map[podKey]map[string]string{} // pod → container ("" for any) → message
	for _, e := range f.Events {
		if e.InvolvedObject.Kind != "Pod" || !containsAny(e.Message, oomMarks) {
			continue
		}
		k := podKey{e.InvolvedObject.Namespace, e.InvolvedObject.Name}
		if evOOM[k] == nil {
			evOOM[k] = map[string]string{}
		}
		container := strings.TrimSuffix(strings.TrimPrefix(e.InvolvedObject.FieldPath, "spec.containers{"), "}")
		if container == e.InvolvedObject.FieldPath {
			container = ""
		}
		evOOM[k][container] = e.Message
	}
	var out []Finding
	for _, p := range f.Pods {
		// Finished pods too: a failed one is the case in point.
		asg, err := podgpu.Assignment(&p)
		if err != nil || asg == nil || p.Spec.NodeName == "" {
			continue
		}
		var held []gpu.SliceGuarantee
		for _, c := range p.Status.Conditions {
			if c.Type == gpu.ConditionIsolation {
				held, _ = gpu.ParseSliceGuarantees(c.Message)
			}
		}
		events := evOOM[podKey{p.Namespace, p.Name}]
		for _, cs := range p.Status.ContainerStatuses {
			msg := events[cs.Name]
			if msg == "" {
				msg = events[""]
			}
			for _, t := range []*v1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
				if t != nil && containsAny(t.Message+" "+t.Reason, oomMarks) {
					msg = t.Message
				}
			}
			if msg == "" {
				continue
			}
			for _, c := range asg.Containers {
				if c.Name != cs.Name {
					continue
				}
				for _, g := range c.GPUs {
					mech := gpu.MechanismNone
					for _, h := range held {
						if h.Container == c.Name && h.GPU == g.UUID {
							mech = h.Memory
						}
					}
					remedy := "The slice is too small for the workload: ask for more tessera.dev/gpu-memory."
					if !mech.Enforced() {
						remedy = "Its memory was not held (" + string(mech) + "): a neighbour on the GPU may have taken it. Ask tessera.dev/isolation: memory-hard, or more tessera.dev/gpu-memory."
					}
					out = append(out, Finding{ID: "oom.gpu-containers", Severity: Warning, Subject: p.Namespace + "/" + p.Name + "/" + c.Name,
						Summary:  fmt.Sprintf("ran out of GPU memory in a %d MiB slice of %s (memory held by %s)", g.MemoryMiB, g.UUID, mech),
						Evidence: firstLines(msg, 2), Remedy: remedy})
				}
			}
		}
	}
	return out
}

func containsAny(s string, subs []string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

func checkStall(f ClusterFacts, o ClusterOptions) []Finding {
	var out []Finding
	if f.AgentsErr != nil {
		out = append(out, Finding{ID: "stall.read", Severity: Warning, Summary: "some agents' metrics could not be read, so their GPUs' stalls are unknown", Evidence: f.AgentsErr.Error()})
	}
	for _, s := range f.Stalls {
		if s.Ratio <= o.StallThreshold {
			continue
		}
		out = append(out, Finding{ID: "stall.gpu", Severity: Warning, Subject: s.Node + " " + s.GPU,
			Summary:  fmt.Sprintf("GPU stalled %.0f%% of its busy samples (above %.0f%%)", 100*s.Ratio, 100*o.StallThreshold),
			Evidence: "tessera_gpu_stall_ratio", Remedy: "Its clocks are held down by power or heat: check cooling and power caps (nvidia-smi -q -d PERFORMANCE); on a time-sliced GPU with many tenants, the write-up's advice is a longer time slice — fewer tenants does the same."})
	}
	return out
}

func checkPolicies(f ClusterFacts, _ ClusterOptions) []Finding {
	if f.PolicyErr != nil {
		return []Finding{{ID: "policies.installed", Severity: Warning, Summary: "the admission policies could not be read", Evidence: f.PolicyErr.Error()}}
	}
	var missing, unbound []string
	for _, p := range Policies {
		bound, ok := f.Policies[p]
		switch {
		case !ok:
			missing = append(missing, p)
		case !bound:
			unbound = append(unbound, p)
		}
	}
	var out []Finding
	if len(missing) > 0 {
		out = append(out, Finding{ID: "policies.installed", Severity: Error, Summary: "admission policies missing: tenants can forge their GPU assignment or leave their slice",
			Evidence: strings.Join(missing, " "), Remedy: "Install the chart with admissionPolicies.enabled=true, or apply deploy/admission-policies.yaml."})
	}
	if len(unbound) > 0 {
		out = append(out, Finding{ID: "policies.bound", Severity: Error, Summary: "admission policies without a binding are not in force",
			Evidence: strings.Join(unbound, " "), Remedy: "Apply the bindings of deploy/admission-policies.yaml."})
	}
	if f.AdmissionConfigErr != nil && len(missing) < len(Policies) {
		out = append(out, Finding{ID: "policies.config", Severity: Error,
			Summary:  "the admission policies' ConfigMap cannot be read: they refuse every GPU pod, binding and status change they match",
			Evidence: f.AdmissionConfigErr.Error(), Remedy: "Install the chart again (helm upgrade), or apply deploy/admission-policies.yaml, which holds ConfigMap " + deploy.AdmissionConfigMap + "."})
	}
	if len(out) == 0 {
		out = append(out, pass("policies.installed", "", fmt.Sprintf("all %d admission policies installed and bound, their ConfigMap %s present", len(Policies), deploy.AdmissionConfigMap), ""))
	}
	return out
}
