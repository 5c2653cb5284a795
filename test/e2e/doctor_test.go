package e2e

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/doctor"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/playground"
)

// TestDoctorFindsInjectedFaults: tessera doctor cluster on a healthy
// playground reports nothing worse than info; with faults injected — an
// agent stopped, a pod refused its GPUs, a GPU container that ran out of GPU
// memory, stalled GPUs — it reports each with its remedy, and the healthy
// parts stay ok.
func TestDoctorFindsInjectedFaults(t *testing.T) {
	// The agents run as the chart's DaemonSet's pods, so the doctor can
	// tell what a stopped agent's pod does.
	c, _ := up(t, playground.Options{Nodes: 2, GPUsPerNode: 2, Model: "a100", AgentDaemonSet: true})
	ctx := context.Background()
	var agents []string
	for _, n := range c.Nodes {
		agents = append(agents, n.MetricsURL)
	}
	opts := doctor.ClusterOptions{Namespace: "tessera-system", LeaseNamespace: "kube-system", SchedulerMetrics: c.SchedulerMetricsURL, AgentMetrics: agents,
		HTTP: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}} //nolint:gosec // the playground's self-signed scheduler
	diagnose := func() []doctor.Finding {
		o := opts
		o.Now = time.Now()
		return doctor.DiagnoseCluster(ctx, c.Client, o, 10*time.Second)
	}

	// Healthy: every agent heard from, the policies in force.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return doctor.Worst(diagnose()) <= doctor.Info, nil
	})
	if err != nil {
		for _, f := range diagnose() {
			t.Logf("%s %s %s: %s (%s)", f.Severity, f.ID, f.Subject, f.Summary, f.Evidence)
		}
		t.Fatal("a healthy playground is not all ok")
	}

	// Faults. Every GPU stalls (its power cap holds its clocks) while busy.
	for _, n := range c.Nodes {
		for i := range 2 {
			n.Stall(i, true)
		}
	}
	const ns = "doctor"
	if err := playground.Submit(ctx, c.Client, ns, []playground.PodSpec{{Name: "busy", GPUs: 1, MemoryMiB: 8192, Cores: 50, Sharing: gpu.ModeTimeSlicing}}); err != nil {
		t.Fatal(err)
	}
	oom := playground.PodSpec{Name: "oom", GPUs: 1, MemoryMiB: 4096, Cores: 20, Sharing: gpu.ModeTimeSlicing}.Pod(ns)
	oom.Annotations[playground.AnnotationRunFor] = "1s"
	oom.Annotations[playground.AnnotationExitMessage] = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, oom, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c.Client, ns, []string{"busy"}, 30*time.Second)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "oom", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodFailed, nil
	})
	if err != nil {
		t.Fatal("the oom pod did not fail")
	}
	// A pod an administrator bound past the scheduler, before the policies
	// that now refuse it: its agent refuses it.
	rogue := playground.PodSpec{Name: "rogue", GPUs: 1, MemoryMiB: 4096, Cores: 10}.Pod(ns)
	rogue.Spec.SchedulerName = "elsewhere"
	beforePolicies(t, c, func() {
		refused(t, c.Client, rogue, c.Nodes[0].Name, nil, c.Config, deviceplugin.ErrNoAssignment)
	})
	// The agent of the second node stops.
	c.Nodes[1].StopAgent()

	want := map[string]string{
		"agents.heartbeat":   c.Nodes[1].Name,
		"agents.pod":         c.Nodes[1].Name,
		"refused.gpu-pods":   ns + "/rogue",
		"oom.gpu-containers": ns + "/oom/main",
		"stall.gpu":          "",
	}
	var got []doctor.Finding
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got = diagnose()
		for id, subject := range want {
			found := false
			for _, f := range got {
				if f.ID == id && f.Severity >= doctor.Warning && strings.Contains(f.Subject, subject) {
					found = true
				}
			}
			if !found {
				return false, nil
			}
		}
		return true, nil
	})
	var table strings.Builder
	_ = doctor.Render(&table, got, false)
	t.Logf("tessera doctor cluster, with the faults injected:\n%s", table.String())
	if err != nil {
		t.Fatalf("not every injected fault was found (want %v)", want)
	}
	for _, f := range got {
		switch {
		case f.ID == "agents.heartbeat" && f.Subject == c.Nodes[0].Name && f.Severity != doctor.OK:
			t.Errorf("the running agent is reported: %+v", f)
		case f.ID == "policies.installed" && f.Severity != doctor.OK:
			t.Errorf("policies: %+v", f)
		}
	}
	if doctor.ExitCode(got) != 2 {
		t.Errorf("exit code %d, want 2", doctor.ExitCode(got))
	}
}
