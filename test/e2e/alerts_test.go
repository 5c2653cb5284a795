package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/prometheus/common/model"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// toolBinary is the program name as `make test` builds it from Go modules
// into bin/ (make target bin/name), or the one $env names; a test without
// it is skipped, saying how to build it.
func toolBinary(t *testing.T, name, env string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "..", "bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no %s at %s: `make test` (or `make bin/%s`) builds it from Go modules", name, p, name)
	}
	return p
}

// prometheusBinary is Prometheus' server at the version hack/tools pins.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	return toolBinary(t, "prometheus", "TESSERA_PROMETHEUS")
}

// prometheus is a real Prometheus server the test started, with the
// shipped rules, scraping a playground.
type prometheus struct {
	t   *testing.T
	api string
}

// promAlert is one alert as Prometheus' /api/v1/alerts lists it.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// tesseraScrapes are the scrape configurations of the playground's agents
// and scheduler, as the chart's ServiceMonitors scrape them: the agents'
// own labels win (honor_labels), the target's node added; the scheduler
// over HTTPS.
func tesseraScrapes(t *testing.T, c *playground.Cluster) string {
	t.Helper()
	var agents []string
	for _, n := range c.Nodes {
		u, err := url.Parse(n.MetricsURL)
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, fmt.Sprintf("{targets: [%q], labels: {node: %q}}", u.Host, n.Name))
	}
	sched, err := url.Parse(c.SchedulerMetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`  - job_name: tessera-agent-metrics
    honor_labels: true
    static_configs: [%s]
  - job_name: tessera-scheduler-metrics
    scheme: https
    tls_config: {insecure_skip_verify: true}
    static_configs: [{targets: [%q]}]
`, strings.Join(agents, ", "), sched.Host)
}

// shippedRules is the absolute path of the shipped rule file.
func shippedRules(t *testing.T) string {
	t.Helper()
	rules, err := filepath.Abs(filepath.Join("..", "..", "deploy", "prometheus", "tessera-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startPrometheus runs bin at the scrape and evaluation interval every
// (which is also the scrape timeout) with the rule file rules and the
// scrape configurations scrapes, until the test ends; its log is shown
// when the test fails.
func startPrometheus(t *testing.T, bin, rules, scrapes string, every time.Duration) *prometheus {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf("global: {scrape_interval: %s, scrape_timeout: %[1]s, evaluation_interval: %[1]s}\nrule_files: [%q]\nscrape_configs:\n%s",
		model.Duration(every), rules, scrapes)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	startProcess(t, "Prometheus", bin, "--config.file", filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", addr, "--log.level", "warn")
	return &prometheus{t: t, api: "http://" + addr + "/api/v1/"}
}

// startProcess starts a server the test needs and stops it when the test
// ends, showing its output if the test failed.
func startProcess(t *testing.T, what, bin string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("%s's log:\n%s", what, b)
		}
	})
}

func (p *prometheus) get(path string, v any) error {
	resp, err := http.Get(p.api + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// waitUntil polls cond until it holds, failing the test after limit; it
// returns how long it took.
func (p *prometheus) waitUntil(what string, limit time.Duration, cond func() bool) time.Duration {
	p.t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.t.Fatalf("%s: not within %v", what, limit)
	return 0
}

// scalar is the value of an instant query that returns one sample.
func (p *prometheus) scalar(query string) (string, bool) {
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := p.get("query?query="+url.QueryEscape(query), &r); err != nil || len(r.Data.Result) != 1 {
		return "", false
	}
	v, ok := r.Data.Result[0].Value[1].(string)
	return v, ok
}

// targetsUp waits until n targets are up, and then a few scrapes more, so
// that counters are seen at their zeros before a fault raises them.
func (p *prometheus) targetsUp(n int) {
	p.t.Helper()
	p.waitUntil(fmt.Sprintf("%d targets up", n), 60*time.Second, func() bool {
		v, ok := p.scalar(`sum(up)`)
		return ok && v == fmt.Sprint(n)
	})
	p.waitUntil(fmt.Sprintf("%d targets scraped three times", n), 60*time.Second, func() bool {
		v, ok := p.scalar(`count(sum_over_time(up[10m]) >= 3)`)
		got, err := strconv.Atoi(v)
		return ok && err == nil && got >= n
	})
}

func (p *prometheus) alerts() []promAlert {
	var r struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := p.get("alerts", &r); err != nil {
		return nil
	}
	return r.Data.Alerts
}

// raised waits up to limit until the alert name is pending or firing with
// the labels want, checks it is raised once, and logs how long after since
// (the fault) it was.
func (p *prometheus) raised(name string, want map[string]string, since time.Time, limit time.Duration) {
	p.t.Helper()
	var matching []promAlert
	p.waitUntil(name+" pending or firing", limit, func() bool {
		matching = nil
		for _, a := range p.alerts() {
			if a.Labels["alertname"] != name {
				continue
			}
			ok := true
			for k, v := range want {
				ok = ok && a.Labels[k] == v
			}
			if ok {
				matching = append(matching, a)
			}
		}
		return len(matching) > 0
	})
	if len(matching) != 1 {
		p.t.Errorf("%s raised %d times: %+v", name, len(matching), matching)
	}
	p.t.Logf("%s %s %v after the fault", name, matching[0].State, time.Since(since).Round(100*time.Millisecond))
}

// TestAlertsFireInARealPrometheus runs a real Prometheus against a
// playground — scraping its agents and its scheduler as the ServiceMonitors
// do, with the shipped rule file — injects faults, and waits for each
// alert to go pending or firing, once (issue 39: promtool on recorded
// series is not enough; a counter born at its first value made
// TesseraInventoryErrors unable to fire, and agents re-exporting each
// other's series made one MPS restart fire four times).
func TestAlertsFireInARealPrometheus(t *testing.T) {
	bin := prometheusBinary(t)
	c, _ := up(t, playground.Options{Nodes: 2, GPUsPerNode: 2, Model: "h100", MPSNodes: 1})
	p := startPrometheus(t, bin, shippedRules(t), tesseraScrapes(t, c), time.Second)
	// Every target up: both agents and the scheduler.
	p.targetsUp(3)
	raised := func(name string, want map[string]string) {
		t.Helper()
		p.raised(name, want, time.Now(), 60*time.Second)
	}

	mpsNode, tsNode := c.Nodes[0], c.Nodes[1]
	// An XID on a time-sliced GPU: out of service (TesseraGPUUnhealthy).
	tsNode.InjectXid(1, 79)
	raised("TesseraGPUUnhealthy", map[string]string{"node": tsNode.Name, "gpu": "1"})
	// A tenant quits an MPS daemon; the agent restarts it.
	if err := mpsNode.QuitMPS(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	raised("TesseraMPSDaemonRestarts", map[string]string{"node": mpsNode.Name, "gpu": "0"})
	// A tenant of an MPS GPU (30 % of it, so the server is held to 30 %)
	// lifts the GPU's limits; the agent restores them.
	const ns = "alerts"
	if err := playground.Submit(context.Background(), c.Client, ns, []playground.PodSpec{
		{Name: "mps-tenant", GPUs: 1, MemoryMiB: 8192, Cores: 30, Sharing: gpu.ModeMPS}}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c.Client, ns, []string{"mps-tenant"}, 30*time.Second)
	a, err := podgpu.Assignment(get(t, c.Client, ns, "mps-tenant"))
	if err != nil || a == nil || a.Node != mpsNode.Name {
		t.Fatalf("mps-tenant's assignment %+v, %v: want one on %s", a, err, mpsNode.Name)
	}
	index := a.Containers[0].GPUs[0].Index
	if out, err := mpsNode.MPSCommand(context.Background(), index, "set_default_active_thread_percentage 100"); err != nil {
		t.Fatalf("set_default_active_thread_percentage: %v: %s", err, out)
	}
	raised("TesseraMPSLimitsRestored", map[string]string{"node": mpsNode.Name, "gpu": fmt.Sprint(index)})
	// Its GPU's clocks held down by the power cap while it is busy.
	mpsNode.Stall(index, true)
	raised("TesseraGPUStalled", map[string]string{"node": mpsNode.Name, "gpu": fmt.Sprint(index)})
	mpsNode.Stall(index, false)
	// Its assignment rewritten after binding, by the only identity the
	// policies let write it: the agent keeps the first and counts it.
	changed := strings.Replace(get(t, c.Client, ns, "mps-tenant").Annotations[gpu.AnnotationAssignment], `"memoryMiB":8192`, `"memoryMiB":81920`, 1)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{gpu.AnnotationAssignment: changed}}})
	scheduler := kubernetes.NewForConfigOrDie(playground.As(c.Config, deploy.SchedulerUser, nil))
	if _, err := scheduler.CoreV1().Pods(ns).Patch(context.Background(), "mps-tenant", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	raised("TesseraAssignmentChanged", map[string]string{"node": mpsNode.Name})
	// And then to something no one can read: the scheduler cannot book it.
	patch, _ = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{gpu.AnnotationAssignment: `{"v":"v1","node":`}}})
	if _, err := scheduler.CoreV1().Pods(ns).Patch(context.Background(), "mps-tenant", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	raised("TesseraAssignmentErrors", nil)
	// The node's inventory overwritten with garbage by its own agent's
	// token: the scheduler cannot use it until the agent restores it.
	garbage := fmt.Sprintf(`{"metadata":{"annotations":{%q:"{\"v\":\"v1\",\"gpus\":[{\"memoryMiB\":300000}"}}}`, gpu.AnnotationInventory)
	agent := kubernetes.NewForConfigOrDie(playground.AsAgent(c.Config, tsNode.Name))
	if _, err := agent.CoreV1().Nodes().Patch(context.Background(), tsNode.Name, types.MergePatchType, []byte(garbage), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	raised("TesseraInventoryErrors", map[string]string{"node": tsNode.Name})
	// A GPU pod bound on a node whose agent is gone, having withdrawn the
	// inventory on its way out: the pod's GPUs are counted on no node. The
	// alert holds 5 minutes before firing; pending is what it shows now.
	if err := playground.Submit(context.Background(), c.Client, ns, []playground.PodSpec{
		{Name: "ts-tenant", GPUs: 1, MemoryMiB: 8192, Cores: 30, Sharing: gpu.ModeTimeSlicing}}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c.Client, ns, []string{"ts-tenant"}, 30*time.Second)
	if n := get(t, c.Client, ns, "ts-tenant").Spec.NodeName; n != tsNode.Name {
		t.Fatalf("ts-tenant on %s, want %s", n, tsNode.Name)
	}
	tsNode.StopAgent()
	withdraw := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, gpu.AnnotationInventory)
	if _, err := agent.CoreV1().Nodes().Patch(context.Background(), tsNode.Name, types.MergePatchType, []byte(withdraw), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	raised("TesseraOrphanedGPUPods", nil)
}

// kubeStateMetricsBinary is kube-state-metrics at the version
// hack/tools/kube-state-metrics pins.
func kubeStateMetricsBinary(t *testing.T) string {
	t.Helper()
	return toolBinary(t, "kube-state-metrics", "TESSERA_KUBE_STATE_METRICS")
}

// shortened is the shipped rule file with each of the bounds in short
// (an expression's text → its replacement) shortened, written where the
// test's Prometheus reads it; a bound not found once fails the test, so
// a change to the rule shows here.
func shortened(t *testing.T, short map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(shippedRules(t))
	if err != nil {
		t.Fatal(err)
	}
	rules := string(b)
	for from, to := range short {
		if n := strings.Count(rules, from); n != 1 {
			t.Fatalf("the shipped rules hold %q %d times, want once", from, n)
		}
		rules = strings.Replace(rules, from, to, 1)
	}
	path := filepath.Join(t.TempDir(), "tessera-rules.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestComponentAlertsFireInARealPrometheus raises, in a real Prometheus,
// the alerts the first test's faults do not: the agents' and the
// scheduler's own failures, preemption's, and the agent DaemonSet's state
// as kube-state-metrics (built from Go modules, run against the
// playground) exports it — the agent pods made by kube-controller-manager's
// DaemonSet controller. Each alert's rule is the shipped one; only
// TesseraGPUPodsPendingLong's 15 minutes are cut to 10 s.
func TestComponentAlertsFireInARealPrometheus(t *testing.T) {
	bin := prometheusBinary(t)
	ksm := kubeStateMetricsBinary(t)
	c, _ := up(t, playground.Options{Nodes: 3, GPUsPerNode: 1, Model: "h200", ReclaimTimeout: 3 * time.Second, AgentDaemonSet: true})
	// kube-state-metrics as kube-prometheus-stack runs it, on the
	// resources the alerts read; scraped with honor_labels, as there.
	ksmAddr, ksmTelemetry := freeAddr(t), freeAddr(t)
	host, port, _ := net.SplitHostPort(ksmAddr)
	_, tport, _ := net.SplitHostPort(ksmTelemetry)
	startProcess(t, "kube-state-metrics", ksm, "--kubeconfig", c.Kubeconfig, "--resources", "daemonsets,pods",
		"--host", host, "--port", port, "--telemetry-host", host, "--telemetry-port", tport)
	scrapes := tesseraScrapes(t, c) + fmt.Sprintf(`  - job_name: kube-state-metrics
    honor_labels: true
    static_configs: [{targets: [%q]}]
`, ksmAddr)
	rules := shortened(t, map[string]string{
		"tessera_scheduler_pending_gpu_pod_age_seconds > 900": "tessera_scheduler_pending_gpu_pod_age_seconds > 10",
	})
	p := startPrometheus(t, bin, rules, scrapes, time.Second)
	// Three agents, the scheduler and kube-state-metrics.
	p.targetsUp(5)
	// kube-state-metrics sees the DaemonSet with all three agents ready.
	p.waitUntil("kube-state-metrics' tessera-agent DaemonSet", 30*time.Second, func() bool {
		v, ok := p.scalar(`kube_daemonset_status_number_ready{daemonset="tessera-agent"}`)
		return ok && v == "3"
	})
	hung, failing, stuck := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	const ns = "component-alerts"

	// NVML hangs on one node (which takes no pods from now on): its
	// agent's sampling pass does not return. Checked last: the rule waits
	// a minute of silence.
	cordon(t, c.Client, hung.Name, true)
	hung.HangNVML(true)
	hungAt := time.Now()

	// A GPU pod that no node can take (two GPUs; each node has one).
	at := time.Now()
	if err := playground.Submit(context.Background(), c.Client, ns, []playground.PodSpec{
		{Name: "too-big", GPUs: 2, Sharing: gpu.ModeExclusive}}); err != nil {
		t.Fatal(err)
	}
	p.raised("TesseraGPUPodsPendingLong", nil, at, 60*time.Second)

	// The driver of the second node refuses time-slice classes; an
	// inference tenant arrives there, so the agent sets its GPU's class.
	failing.TimeSlices.Fail(errors.New("nvidia-smi: Setting the compute policy is not supported on this GPU"))
	cordon(t, c.Client, stuck.Name, true)
	at = time.Now()
	if err := playground.Submit(context.Background(), c.Client, ns, []playground.PodSpec{
		{Name: "infer", GPUs: 1, MemoryMiB: 8192, Cores: 30, Sharing: gpu.ModeTimeSlicing, Workload: gpu.WorkloadInference}}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c.Client, ns, []string{"infer"}, 30*time.Second)
	p.raised("TesseraTimeSliceFailures", map[string]string{"node": failing.Name, "gpu": "0"}, at, 60*time.Second)

	// A preemption victim on the third node leaves a process that
	// survives SIGKILL: the agent cannot reclaim it, and the scheduler,
	// after its (here 3 s) reclaim timeout, releases the victim's GPU
	// without the confirmation.
	cordon(t, c.Client, failing.Name, true)
	cordon(t, c.Client, stuck.Name, false)
	create(t, c.Client, wholeGPU(ns, "victim", "gpu-batch", map[string]string{
		playground.AnnotationOnPreemption: "exit", playground.AnnotationLeftover: "unkillable"}))
	waitRunning(t, c.Client, ns, []string{"victim"}, 30*time.Second)
	at = time.Now()
	create(t, c.Client, wholeGPU(ns, "urgent", "gpu-critical", nil))
	p.raised("TesseraReclaimStuck", map[string]string{"node": stuck.Name}, at, 60*time.Second)
	p.raised("TesseraReclaimTimedOut", nil, at, 60*time.Second)

	// The second node's agent stops, as a crashed agent pod: its metrics
	// endpoint stops answering, its pod is not ready, and the DaemonSet
	// has one ready agent fewer than it wants.
	at = time.Now()
	failing.StopAgent()
	p.raised("TesseraAgentDown", map[string]string{"node": failing.Name}, at, 60*time.Second)
	p.raised("TesseraAgentNotReady", map[string]string{"node": failing.Name, "namespace": deploy.Namespace}, at, 60*time.Second)
	p.raised("TesseraAgentsMissing", map[string]string{"daemonset": "tessera-agent"}, at, 60*time.Second)

	// No scheduler runs any more.
	at = time.Now()
	c.StopScheduler()
	p.raised("TesseraSchedulerDown", nil, at, 60*time.Second)

	p.raised("TesseraAgentSamplingStalled", map[string]string{"node": hung.Name}, hungAt, 3*time.Minute)
}

// TestEveryShippedAlertIsRaisedHere keeps the two tests above complete:
// every alert of the shipped rule file is raised by one of them, so a new
// alert comes with its fault (issue 39).
func TestEveryShippedAlertIsRaisedHere(t *testing.T) {
	rules, err := os.ReadFile(shippedRules(t))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("alerts_test.go")
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`(?m)^\s+- alert: (\w+)$`).FindAllStringSubmatch(string(rules), -1)
	if len(names) < 17 {
		t.Fatalf("found %d alerts in the shipped rules; the pattern no longer matches the file", len(names))
	}
	for _, m := range names {
		if !strings.Contains(string(src), `raised("`+m[1]+`"`) {
			t.Errorf("alert %s is raised by no end-to-end test here", m[1])
		}
	}
}
