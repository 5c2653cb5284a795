package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/cgroup"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// wholeGPU is a pod holding one whole GPU, at a priority class, with extra
// annotations (the playground's scripting of its workload).
func wholeGPU(ns, name, class string, ann map[string]string) *v1.Pod {
	p := playground.PodSpec{Name: name, GPUs: 1, Sharing: gpu.ModeExclusive, PriorityClass: class}.Pod(ns)
	for k, v := range ann {
		p.Annotations[k] = v
	}
	return p
}

func create(t *testing.T, client kubernetes.Interface, p *v1.Pod) *v1.Pod {
	t.Helper()
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	got, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func get(t *testing.T, client kubernetes.Interface, ns, name string) *v1.Pod {
	t.Helper()
	p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return p
}

// events lists the reasons of the events about a pod (core/v1 lists those
// written through events.k8s.io/v1 too: one resource, two APIs).
func events(t *testing.T, client kubernetes.Interface, ns, name string) []string {
	t.Helper()
	evs, err := client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

func hasAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// value reads one series (name{labels} as the text format writes it) from
// a scrape; 0 when absent. Counters are per process, so tests compare
// before and after.
func value(body, series string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// runningAfter waits for a pod to run and returns how long after since.
func runningAfter(t *testing.T, client kubernetes.Interface, ns, name string, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	waitRunning(t, client, ns, []string{name}, timeout)
	return time.Since(since)
}

// triedAndWaiting waits, up to bound, until the scheduler has tried the
// pod and left it waiting (its PodScheduled condition False, reason
// Unschedulable), and fails if the pod was placed meanwhile: the event that
// a negative check waits for, rather than a fixed while.
func triedAndWaiting(t *testing.T, client kubernetes.Interface, ns, name string, bound time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, bound, true, func(context.Context) (bool, error) {
		p := get(t, client, ns, name)
		if p == nil || p.Spec.NodeName != "" {
			t.Fatalf("%s was placed (or vanished); it must wait", name)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%s: the scheduler did not report it waiting within %v", name, bound)
	}
}

// stillPending checks a pod stays unbound for d: for what must last longer
// than a known period (a GPU held out of service past its quiet period),
// where no event marks the time.
func stillPending(t *testing.T, client kubernetes.Interface, ns, name string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if p := get(t, client, ns, name); p == nil || p.Spec.NodeName != "" {
			t.Fatalf("%s was placed (or vanished); it must wait", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPreemptionCooperatingVictims: a victim that exits on its notice, and
// one that reports its checkpoint, end the wait early: both preemptors run
// long before the 30 s grace period.
func TestPreemptionCooperatingVictims(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 2, Model: "h100"})
	const ns = "coop"
	create(t, c.Client, wholeGPU(ns, "exits", "gpu-batch", map[string]string{playground.AnnotationOnPreemption: "exit"}))
	create(t, c.Client, wholeGPU(ns, "checkpoints", "gpu-batch", map[string]string{playground.AnnotationOnPreemption: "checkpoint",
		preemption.AnnotationSignal: "SIGUSR1"}))
	waitRunning(t, c.Client, ns, []string{"exits", "checkpoints"}, 30*time.Second)

	const soft = `tessera_scheduler_preemption_levels_total{level="soft"}`
	softBefore := value(scrape(t, c.SchedulerMetricsURL), soft)
	start := time.Now()
	create(t, c.Client, wholeGPU(ns, "urgent-a", "gpu-critical", nil))
	create(t, c.Client, wholeGPU(ns, "urgent-b", "gpu-critical", nil))
	took := runningAfter(t, c.Client, ns, "urgent-a", start, 20*time.Second)
	tookB := runningAfter(t, c.Client, ns, "urgent-b", start, 20*time.Second)
	t.Logf("cooperating victims: preemptors Running %v and %v after creation (grace period 30 s)", took.Round(time.Millisecond), tookB.Round(time.Millisecond))
	if max(took, tookB) > 15*time.Second {
		t.Errorf("preemptors waited %v, %v: the victims' early end was not honoured", took, tookB)
	}
	// The one that exited stays as a completed pod; the one that reported
	// its checkpoint was stopped by the controller.
	if p := get(t, c.Client, ns, "exits"); p == nil || p.Status.Phase != v1.PodSucceeded {
		t.Errorf("exiting victim: %v", p)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return get(t, c.Client, ns, "checkpoints") == nil, nil
	})
	if err != nil {
		t.Error("the victim that reported its checkpoint was not stopped")
	}
	for _, v := range []string{"exits", "checkpoints"} {
		if ev := events(t, c.Client, ns, v); !hasAll(ev, "PreemptionNotice") {
			t.Errorf("%s: events %v, want PreemptionNotice", v, ev)
		}
	}
	if ev := events(t, c.Client, ns, "checkpoints"); !hasAll(ev, "PreemptedAfterCheckpoint") {
		t.Errorf("checkpoints: events %v", ev)
	}
	// The signal it asked for went to its simulated GPU process, through
	// the playground's process table: simulated PIDs are not the host's,
	// and kill(2) on them would signal the machine's own processes (issue
	// 38).
	signalled := 0
	for pid, sigs := range c.Nodes[0].Signals() {
		for _, s := range sigs {
			if s == syscall.SIGUSR1 {
				signalled++
				t.Logf("simulated process %d got %v", pid, s)
			}
		}
	}
	if signalled != 1 {
		t.Errorf("%d simulated processes got SIGUSR1, want the checkpointing victim's one (%v)", signalled, c.Nodes[0].Signals())
	}
	if ev := events(t, c.Client, ns, "urgent-a"); !hasAll(ev, "Preempting") {
		t.Errorf("preemptor: events %v, want Preempting", ev)
	}
	body := scrape(t, c.SchedulerMetricsURL)
	for _, want := range []string{`tessera_scheduler_preemptions_total{result="started"}`, "tessera_scheduler_preemption_victims_count"} {
		if !strings.Contains(body, want) {
			t.Errorf("scheduler metrics lack %s", want)
		}
	}
	if d := value(body, soft) - softBefore; d != 2 {
		t.Errorf("%v soft preemptions counted, want 2", d)
	}
}

// TestPlaygroundStaysOnTheLoopback runs the hard-path preemption test,
// whose scene record makes the API server fetch the victim's log from its
// node's kubelet, again in a fresh network namespace that has nothing but
// the loopback: a playground that resolved a name or dialed an address off
// the machine fails there (issue 38: the API server resolved gpu-node-N
// through the host's resolver). It needs root (unshare --net) and ip(8).
func TestPlaygroundStaysOnTheLoopback(t *testing.T) {
	if os.Getenv(inNetnsEnv) != "" {
		t.Skip("already inside the fresh network namespace")
	}
	if testing.Short() {
		t.Skip("starts a whole playground; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("a fresh network namespace (unshare --net) needs root; run make test as root to include this check")
	}
	for _, tool := range []string{"unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found (util-linux, iproute2): %v", tool, err)
		}
	}
	cmd := exec.Command("unshare", "--net", "sh", "-c", `ip link set lo up && exec "$0" "$@"`,
		os.Args[0], "-test.run", "^TestPreemptionHardPathRecordsTheScene$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "unshare failed") || strings.Contains(string(out), "Operation not permitted") {
		t.Skipf("this machine allows no network namespace: %s", out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestPreemptionHardPathRecordsTheScene") {
		t.Fatalf("in a network namespace with only the loopback: %v\n%s", err, out)
	}
	if ifs, err := exec.Command("unshare", "--net", "ip", "-o", "link").Output(); err == nil && strings.Count(string(ifs), "\n") != 1 {
		t.Errorf("a fresh network namespace here has more than the loopback:\n%s", ifs)
	}
}

// inNetnsEnv marks the run of a test inside TestPlaygroundStaysOnTheLoopback.
const inNetnsEnv = "TESSERA_E2E_IN_NETNS"

// TestPreemptionHardPathRecordsTheScene: a victim that ignores its notice is
// stopped when its (shortened) grace period ends, and its scene is recorded.
func TestPreemptionHardPathRecordsTheScene(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 1, Model: "a100"})
	const ns = "hard"
	victim := create(t, c.Client, wholeGPU(ns, "stubborn", "gpu-standard", map[string]string{preemption.AnnotationGrace: "2s"}))
	waitRunning(t, c.Client, ns, []string{"stubborn"}, 30*time.Second)
	victim = get(t, c.Client, ns, "stubborn")
	asg, _ := podgpu.BoundAssignment(victim)

	const hardSeries = `tessera_scheduler_preemption_levels_total{level="hard"}`
	hardBefore := value(scrape(t, c.SchedulerMetricsURL), hardSeries)
	start := time.Now()
	pre := create(t, c.Client, wholeGPU(ns, "urgent", "gpu-critical", nil))
	took := runningAfter(t, c.Client, ns, "urgent", start, 30*time.Second)
	t.Logf("hard preemption: preemptor Running %v after creation (grace period 2 s)", took.Round(time.Millisecond))
	if took < 2*time.Second {
		t.Errorf("preemptor ran after %v, before the victim's grace period ended", took)
	}
	if ev := events(t, c.Client, ns, "stubborn"); !hasAll(ev, "PreemptionNotice", "PreemptedHard") {
		t.Errorf("victim events %v", ev)
	}

	cms, err := c.Client.CoreV1().ConfigMaps(preemption.RecordNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: preemption.RecordLabel})
	if err != nil || len(cms.Items) != 1 {
		t.Fatalf("scene records: %v, %v", cms, err)
	}
	var sc preemption.Scene
	if err := json.Unmarshal([]byte(cms.Items[0].Data["scene.json"]), &sc); err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		field     string
		got, want any
	}{
		{"victim", sc.Victim, ns + "/stubborn"},
		{"uid", sc.UID, string(victim.UID)},
		{"node", sc.Node, c.Nodes[0].Name},
		{"priority", sc.Priority, int32(100000)},
		{"priorityClass", sc.PriorityClass, "gpu-standard"},
		{"preemptor", sc.Preemptor, ns + "/urgent"},
		{"preemptorUID", sc.PreemptorUID, string(pre.UID)},
		{"assignment GPU", sc.Assignment.Containers[0].GPUs[0].UUID, asg.Containers[0].GPUs[0].UUID},
		{"container image", sc.Containers[0].Image, victim.Spec.Containers[0].Image},
		{"container gpu limit", sc.Containers[0].Limits[gpu.ResourceGPU], "1"},
		{"container running when stopped", sc.Containers[0].State.Running != nil, true},
		{"grace", sc.Deadline.Sub(sc.NoticeAt), 2 * time.Second},
		{"stopped at or after the deadline", !sc.StoppedAt.Before(sc.Deadline), true},
		{"reason names the preemptor", strings.Contains(sc.Reason, ns+"/urgent"), true},
		// From the stand-in kubelet's API on the loopback, which the API
		// server reaches by the Node's InternalIP and port (issue 38: it
		// resolved the node's name through the host's resolver).
		{"log", strings.Contains(sc.Containers[0].LastLog, "tessera playground: container main of pod "+ns+"/stubborn"), true},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("scene %s = %v, want %v", ch.field, ch.got, ch.want)
		}
	}
	if d := value(scrape(t, c.SchedulerMetricsURL), hardSeries) - hardBefore; d != 1 {
		t.Errorf("%v hard preemptions counted, want 1", d)
	}
}

// TestPreemptionReclaimsLeftovers: a victim that leaves a process on its GPU
// has it killed by the agent before the preemptor is placed; one whose
// process cannot be killed takes its GPU out of service, and the preemptor
// is not placed on it.
func TestPreemptionReclaimsLeftovers(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 2, GPUsPerNode: 1, Model: "h200", QuietPeriod: 2 * time.Second})
	const ns = "reclaim"
	ann := map[string]string{playground.AnnotationOnPreemption: "exit", playground.AnnotationLeftover: "process"}
	v := create(t, c.Client, wholeGPU(ns, "leaky", "gpu-batch", ann))
	ann2 := map[string]string{playground.AnnotationOnPreemption: "exit", playground.AnnotationLeftover: "unkillable"}
	create(t, c.Client, wholeGPU(ns, "stuck", "gpu-batch", ann2))
	pods := waitRunning(t, c.Client, ns, []string{"leaky", "stuck"}, 30*time.Second)
	var leakyNode, stuckNode *playground.Node
	for _, n := range c.Nodes {
		if pods["leaky"].Spec.NodeName == n.Name {
			leakyNode = n
		} else {
			stuckNode = n
		}
	}

	// One preemptor: the victims are alike, so it takes one of the two
	// nodes; make it the leaky one by cordoning the other.
	cordon(t, c.Client, stuckNode.Name, true)
	killedSeries := `tessera_reclaim_killed_processes_total{node="` + leakyNode.Name + `"}`
	stuckSeries := `tessera_reclaim_total{node="` + stuckNode.Name + `",result="stuck"}`
	killedBefore := value(scrape(t, leakyNode.MetricsURL), killedSeries)
	stuckBefore := value(scrape(t, stuckNode.MetricsURL), stuckSeries)
	start := time.Now()
	create(t, c.Client, wholeGPU(ns, "urgent", "gpu-critical", nil))
	// When the preemptor is bound, the victim's process must be gone.
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		p := get(t, c.Client, ns, "urgent")
		if p == nil || p.Spec.NodeName == "" {
			return false, nil
		}
		if left := processesOf(t, leakyNode, string(v.UID)); len(left) > 0 {
			t.Errorf("preemptor bound while the victim's processes %v still hold the GPU", left)
		}
		return true, nil
	})
	if err != nil {
		t.Fatal("preemptor not bound")
	}
	took := runningAfter(t, c.Client, ns, "urgent", start, 10*time.Second)
	t.Logf("leftover reclaimed: preemptor Running %v after creation", took.Round(time.Millisecond))
	if d := value(scrape(t, leakyNode.MetricsURL), killedSeries) - killedBefore; d != 1 {
		t.Errorf("agent counted %v killed leftovers, want 1", d)
	}

	// The stuck one: its GPU goes out of service; the preemptor waits.
	cordon(t, c.Client, stuckNode.Name, false)
	cordon(t, c.Client, leakyNode.Name, true)
	create(t, c.Client, wholeGPU(ns, "urgent-2", "gpu-critical", nil))
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, stuckNode.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		inv, _ := inventory.FromNode(n)
		return inv != nil && !inv.GPUs[0].Healthy, nil
	})
	if err != nil {
		t.Fatal("the GPU with an unkillable leftover stayed in service")
	}
	// It stays out of service while the process lives, well past the
	// quiet period (2 s here): the agent tries again at every pass and
	// renews the fault, reporting it once.
	stillPending(t, c.Client, ns, "urgent-2", 6*time.Second)
	if inv, _ := inventory.FromNode(mustNode(t, c.Client, stuckNode.Name)); inv == nil || inv.GPUs[0].Healthy {
		t.Fatal("the GPU came back into service while the process that would not die still held it")
	}
	if d := value(scrape(t, stuckNode.MetricsURL), stuckSeries) - stuckBefore; d != 1 {
		t.Errorf("agent counted %v stuck reclaims, want 1", d)
	}
	// A GPU reset ends the process: the victim is reclaimed, the GPU
	// returns after the quiet period, and the preemptor runs there.
	if n := stuckNode.ReleaseStuck(); n == 0 {
		t.Fatal("no process that would not die to reset")
	}
	runningAfter(t, c.Client, ns, "urgent-2", time.Now(), 30*time.Second)
}

func cordon(t *testing.T, client kubernetes.Interface, node string, on bool) {
	t.Helper()
	patch := []byte(`{"spec":{"unschedulable":` + strconv.FormatBool(on) + `}}`)
	if _, err := client.CoreV1().Nodes().Patch(context.Background(), node, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// processesOf lists the PIDs of a pod's processes on a node's mock GPUs.
func processesOf(t *testing.T, n *playground.Node, podUID string) []uint32 {
	t.Helper()
	var out []uint32
	for _, d := range n.NVML.Devices {
		procs, _ := d.GetComputeRunningProcesses()
		for _, p := range procs {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(n.CDIDir), "proc", strconv.Itoa(int(p.Pid)), "cgroup"))
			if err != nil {
				continue
			}
			if ref, err := cgroup.Parse(string(b)); err == nil && ref.PodUID == podUID {
				out = append(out, p.Pid)
			}
		}
	}
	return out
}

// TestPreemptionRespectsPolicyAndBudgets: a preemptor whose class says
// preemptionPolicy: Never evicts no one; a victim covered by a
// PodDisruptionBudget that allows no disruption is not evicted; no one is
// evicted for a pod that would not fit anyway; and equal priority is never
// evicted.
func TestPreemptionRespectsPolicyAndBudgets(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 1, Model: "h100"})
	const ns = "rules"
	low := wholeGPU(ns, "low", "", nil)
	low.Labels["team"] = "research"
	create(t, c.Client, low)
	waitRunning(t, c.Client, ns, []string{"low"}, 30*time.Second)

	// A budget that allows no disruption protects it from a critical pod
	// (checked below; made now, so the scheduler has long seen it).
	// (No disruption controller runs in the playground: the test sets the
	// budget's status as that controller would.)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "research", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "research"}}}}
	pdb, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Create(context.Background(), pdb, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1, ObservedGeneration: pdb.Generation}
	if pdb, err = c.Client.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(context.Background(), pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// gpu-batch: priority 1000 > 0, but preemptionPolicy Never.
	create(t, c.Client, wholeGPU(ns, "polite", "gpu-batch", nil))
	// Two GPUs on a one-GPU node: impossible whatever is evicted.
	big := playground.PodSpec{Name: "too-big", GPUs: 2, Sharing: gpu.ModeExclusive, PriorityClass: "gpu-critical"}.Pod(ns)
	create(t, c.Client, big)
	// Equal priority to the one below is never evicted: a 0-priority pod.
	create(t, c.Client, wholeGPU(ns, "peer", "", nil))
	// Each was tried and left waiting, too-big's preemption found
	// impossible, before anything below is looked at.
	for _, n := range []string{"polite", "too-big", "peer"} {
		triedAndWaiting(t, c.Client, ns, n, 30*time.Second)
	}
	if p := get(t, c.Client, ns, "low"); preemption.IsVictim(p) {
		t.Fatalf("low was notified: %v", p.Annotations)
	}
	if !strings.Contains(scrape(t, c.SchedulerMetricsURL), `tessera_scheduler_preemptions_total{result="impossible"}`) {
		t.Error("no impossible preemption counted for too-big")
	}

	create(t, c.Client, wholeGPU(ns, "critical", "gpu-critical", nil))
	triedAndWaiting(t, c.Client, ns, "critical", 30*time.Second)
	if p := get(t, c.Client, ns, "low"); preemption.IsVictim(p) {
		t.Fatal("low was notified despite its budget")
	}
	// Once the budget allows a disruption, the critical pod gets its GPU.
	pdb.Status.DisruptionsAllowed = 1
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(context.Background(), pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Retry the critical pod now rather than at the queue's next flush (a
	// budget's change wakes no waiting pod); again if the scheduler's
	// informer had not seen the new budget yet.
	for attempt := 0; attempt < 3; attempt++ {
		if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), "critical", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitGone(t, c.Client, ns, "critical")
		create(t, c.Client, wholeGPU(ns, "critical", "gpu-critical", nil))
		err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			return preemption.IsVictim(get(t, c.Client, ns, "low")), nil
		})
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal("low not preempted once its budget allowed it")
	}
}

func waitGone(t *testing.T, client kubernetes.Interface, ns, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return get(t, client, ns, name) == nil, nil
	})
	if err != nil {
		t.Fatalf("%s not gone", name)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestTwoPreemptorsRaceForOneGPU: two critical pods created together for the
// only GPU, held by one low-priority pod: one victim is evicted, once; one
// preemptor runs and the other waits (nothing else to evict).
func TestTwoPreemptorsRaceForOneGPU(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 1, Model: "a100"})
	const ns = "race"
	create(t, c.Client, wholeGPU(ns, "low", "gpu-batch", map[string]string{playground.AnnotationOnPreemption: "exit"}))
	waitRunning(t, c.Client, ns, []string{"low"}, 30*time.Second)
	var wg sync.WaitGroup
	for _, n := range []string{"racer-a", "racer-b"} {
		wg.Go(func() { create(t, c.Client, wholeGPU(ns, n, "gpu-critical", nil)) })
	}
	wg.Wait()
	var winner, loser string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		a, b := get(t, c.Client, ns, "racer-a"), get(t, c.Client, ns, "racer-b")
		switch {
		case a.Status.Phase == v1.PodRunning:
			winner, loser = "racer-a", "racer-b"
		case b.Status.Phase == v1.PodRunning:
			winner, loser = "racer-b", "racer-a"
		}
		return winner != "", nil
	})
	if err != nil {
		t.Fatal("neither preemptor runs")
	}
	triedAndWaiting(t, c.Client, ns, loser, 30*time.Second)
	t.Logf("%s won; %s waits", winner, loser)
	if n := strings.Count(strings.Join(events(t, c.Client, ns, "low"), ","), "PreemptionNotice"); n != 1 {
		t.Errorf("low got %d notices, want 1", n)
	}
	if p := get(t, c.Client, ns, winner); preemption.IsVictim(p) {
		t.Error("the winner was made a victim of the loser (equal priority)")
	}
}

// TestNeedlessPreemptionIsWithdrawn: a preemptor placed before its victim is
// stopped (another GPU freed up meanwhile) spares the victim: the notice is
// withdrawn from the pod and from its containers, and it keeps running.
func TestNeedlessPreemptionIsWithdrawn(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 2, Model: "h100"})
	const ns = "spare"
	v := create(t, c.Client, wholeGPU(ns, "victim", "gpu-batch", nil))
	// Not a candidate (same priority as the preemptor); done in 5 s.
	create(t, c.Client, wholeGPU(ns, "short", "gpu-critical", map[string]string{playground.AnnotationRunFor: "5s"}))
	waitRunning(t, c.Client, ns, []string{"victim", "short"}, 30*time.Second)
	start := time.Now()
	create(t, c.Client, wholeGPU(ns, "urgent", "gpu-critical", nil))
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return preemption.IsVictim(get(t, c.Client, ns, "victim")), nil
	})
	if err != nil {
		t.Fatal("victim never notified")
	}
	notice := filepath.Join(filepath.Dir(c.Nodes[0].CDIDir), "preemption", string(v.UID), preemption.NoticeFile)
	took := runningAfter(t, c.Client, ns, "urgent", start, 20*time.Second)
	t.Logf("preemptor Running %v after creation, on the GPU the short job left", took.Round(time.Millisecond))
	err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		p := get(t, c.Client, ns, "victim")
		_, statErr := os.Stat(notice)
		return p != nil && !preemption.IsVictim(p) && os.IsNotExist(statErr), nil
	})
	if err != nil {
		t.Fatal("notice not withdrawn from the pod and its containers")
	}
	stillRunning := get(t, c.Client, ns, "victim")
	if stillRunning.Status.Phase != v1.PodRunning {
		t.Errorf("spared victim is %s", stillRunning.Status.Phase)
	}
	if ev := events(t, c.Client, ns, "victim"); !hasAll(ev, "PreemptionNotice", "PreemptionCancelled") {
		t.Errorf("victim events %v", ev)
	}
	// It stays spared past its grace period's end would have been.
	time.Sleep(time.Second)
	if get(t, c.Client, ns, "victim") == nil {
		t.Error("spared victim deleted")
	}
}
