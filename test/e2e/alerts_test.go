package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// prometheusBinary is Prometheus' server as `make test` builds it from Go
// modules (bin/prometheus, the version hack/tools pins), or $TESSERA_PROMETHEUS.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TESSERA_PROMETHEUS"); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "..", "bin", "prometheus"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no Prometheus server at %s: `make test` (or `make bin/prometheus`) builds it from Go modules", p)
	}
	return p
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
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join("..", "..", "deploy", "prometheus", "tessera-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
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
	// As the chart's ServiceMonitors scrape: the agents' own labels win
	// (honor_labels), the target's node added; the scheduler over HTTPS.
	config := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: tessera-agent-metrics
    honor_labels: true
    static_configs: [%s]
  - job_name: tessera-scheduler-metrics
    scheme: https
    tls_config: {insecure_skip_verify: true}
    static_configs: [{targets: [%q]}]
`, rules, strings.Join(agents, ", "), sched.Host)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	prom := exec.CommandContext(ctx, bin, "--config.file", filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", addr, "--log.level", "warn")
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	prom.Stdout, prom.Stderr = logFile, logFile
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = prom.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("Prometheus' log:\n%s", b)
		}
	})
	api := "http://" + addr + "/api/v1/"
	query := func(path string, v any) error {
		resp, err := http.Get(api + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(v)
	}
	waitUntil := func(what string, limit time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < limit {
			if cond() {
				return time.Since(start)
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("%s: not within %v", what, limit)
		return 0
	}
	// Every target up: both agents and the scheduler.
	waitUntil("the playground's three targets up", 60*time.Second, func() bool {
		var r struct {
			Data struct {
				Result []struct {
					Value [2]any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if err := query("query?query="+url.QueryEscape(`sum(up)`), &r); err != nil || len(r.Data.Result) != 1 {
			return false
		}
		return r.Data.Result[0].Value[1] == "3"
	})
	// A few scrapes at the counters' zeros first, so that an event is an
	// increase.
	time.Sleep(3 * time.Second)
	type alert struct {
		Labels map[string]string `json:"labels"`
		State  string            `json:"state"`
	}
	alerts := func() []alert {
		var r struct {
			Data struct {
				Alerts []alert `json:"alerts"`
			} `json:"data"`
		}
		if err := query("alerts", &r); err != nil {
			return nil
		}
		return r.Data.Alerts
	}
	// raised waits until name is pending or firing with the labels want,
	// and checks it is raised once.
	raised := func(name string, want map[string]string) time.Duration {
		t.Helper()
		var matching []alert
		took := waitUntil(name+" pending or firing", 60*time.Second, func() bool {
			matching = nil
			for _, a := range alerts() {
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
			t.Errorf("%s raised %d times: %+v", name, len(matching), matching)
		}
		t.Logf("%s %s %v after the fault", name, matching[0].State, took.Round(100*time.Millisecond))
		return took
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
