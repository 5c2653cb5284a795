package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

var zeroGrace = metav1.DeleteOptions{GracePeriodSeconds: new(int64)}

func assignmentOf(t *testing.T, p *v1.Pod) *gpu.PodAssignment {
	t.Helper()
	a, err := podgpu.BoundAssignment(p)
	if err != nil || a == nil {
		t.Fatalf("pod %s: assignment %v, %v", p.Name, a, err)
	}
	return a
}

// expectBest runs the allocator over the nodes as the API server records
// them and returns, for a pod, the nodes with the best score and the
// placement on each.
func expectBest(t *testing.T, c *cluster, policy config.Policy, pod *v1.Pod, invs ...*gpu.NodeInventory) map[string]allocator.Placement {
	t.Helper()
	cfg := config.Default().Allocator
	cfg.Policy = policy
	a, err := allocator.New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	req, err := podgpu.Request(pod, cfg.MinSliceMiB)
	if err != nil {
		t.Fatal(err)
	}
	nodes := c.recount(invs...)
	best := map[string]allocator.Placement{}
	top := 0.0
	for name, n := range nodes {
		var p allocator.Placement
		if !a.Place(n, req, &p).OK() {
			continue
		}
		switch {
		case len(best) == 0 || p.Score > top:
			best, top = map[string]allocator.Placement{name: p}, p.Score
		case p.Score == top:
			best[name] = p
		}
	}
	return best
}

// TestModesLandWhereTheAllocatorSays: whole, MPS and time-sliced requests,
// one at a time, land on a node the allocator ranks best, in the mode the
// decision order gives, on GPUs that hold them.
func TestModesLandWhereTheAllocatorSays(t *testing.T) {
	c := startCluster(t)
	mpsNode := c.addNode(gpuNode{name: "mps-node", gpus: 4, memMi: 81920, mps: true})
	tsNode := c.addNode(gpuNode{name: "ts-node", gpus: 4, memMi: 81920, mps: false})
	c.startScheduler("{policy: binpack}")
	ns := c.namespace("modes")

	steps := []struct {
		pod      podSpec
		wantMode gpu.SharingMode
		wantNode string
	}{
		{podSpec{name: "whole-2", gpus: 2}, gpu.ModeExclusive, ""},
		{podSpec{name: "mps-a", gpus: 1, memMi: 20480, cores: 30, annotations: map[string]string{gpu.AnnotationSharing: "mps"}}, gpu.ModeMPS, "mps-node"},
		{podSpec{name: "ts-a", gpus: 1, memMi: 10240, cores: 20, annotations: map[string]string{gpu.AnnotationSharing: "time-slicing"}}, gpu.ModeTimeSlicing, ""},
		{podSpec{name: "auto-a", gpus: 1, memMi: 8192, cores: 10, annotations: map[string]string{gpu.AnnotationWorkload: "inference"}}, "", ""},
		{podSpec{name: "mps-b", gpus: 1, memMi: 30720, cores: 50, annotations: map[string]string{gpu.AnnotationSharing: "mps"}}, gpu.ModeMPS, "mps-node"},
		{podSpec{name: "whole-1", gpus: 1}, gpu.ModeExclusive, ""},
		{podSpec{name: "ts-b", gpus: 1, memMi: 40960, cores: 60, annotations: map[string]string{gpu.AnnotationSharing: "time-slicing", gpu.AnnotationWorkload: "training"}}, gpu.ModeTimeSlicing, ""},
	}
	for _, s := range steps {
		want := expectBest(t, c, config.PolicyBinpack, makePod(ns, s.pod), mpsNode, tsNode)
		c.createPod(ns, s.pod)
		got := c.waitBound(ns, []string{s.pod.name}, 30*time.Second)[s.pod.name]
		a := assignmentOf(t, got)
		p, ok := want[got.Spec.NodeName]
		if !ok {
			t.Fatalf("%s landed on %s; the allocator's best nodes are %v", s.pod.name, got.Spec.NodeName, keys(want))
		}
		if s.wantNode != "" && got.Spec.NodeName != s.wantNode {
			t.Errorf("%s on %s, want %s", s.pod.name, got.Spec.NodeName, s.wantNode)
		}
		mode := a.Containers[0].Mode
		if s.wantMode != "" && mode != s.wantMode {
			t.Errorf("%s runs %s, want %s", s.pod.name, mode, s.wantMode)
		}
		if len(want) == 1 {
			// A unique best node: the GPUs must be the allocator's too.
			for i, g := range a.Containers[0].GPUs {
				if want := p.Grants[i]; g.MemoryMiB != want.MemoryMiB || g.CoresPerMille != want.Cores {
					t.Errorf("%s GPU %d: %d MiB %d‰, allocator says %d MiB %d‰", s.pod.name, i, g.MemoryMiB, g.CoresPerMille, want.MemoryMiB, want.Cores)
				}
			}
		}
		t.Logf("%s → %s %s %v", s.pod.name, got.Spec.NodeName, mode, a.Containers[0].GPUs)
	}
	nodes := c.recount(mpsNode, tsNode)
	for _, n := range nodes {
		for _, g := range n.GPUs {
			if g.Mode() == gpu.ModeMPS && n.Name != "mps-node" {
				t.Errorf("GPU %s runs MPS on a node without MPS", g.UUID)
			}
		}
	}
}

// TestTwoHundredPodsAtOnce: 200 GPU pods created together on 4 nodes × 8
// GPUs are all placed and no GPU goes over its limits.
func TestTwoHundredPodsAtOnce(t *testing.T) {
	c := startCluster(t)
	var invs []*gpu.NodeInventory
	for i := range 4 {
		invs = append(invs, c.addNode(gpuNode{name: fmt.Sprintf("burst-%d", i), gpus: 8, memMi: 81920, mps: i%2 == 0}))
	}
	c.startScheduler("")
	ns := c.namespace("burst")
	var names []string
	start := time.Now()
	for i := range 200 {
		p := podSpec{name: fmt.Sprintf("p%03d", i)}
		// 15 GPUs held whole and 190 slices needing at least 9.5 GPUs of
		// cores: 25 of the 32 GPUs, so everything fits unless placement
		// fragments the nodes badly.
		switch {
		case i%40 == 0: // 5 whole GPUs
			p.gpus = 1
		case i%40 == 1: // 5 pairs of GPUs
			p.gpus = 2
		default: // 190 inference slices of 5 % and 4 GiB
			p.gpus, p.memMi, p.cores = 1, 4096, 5
			p.annotations = map[string]string{gpu.AnnotationWorkload: "inference"}
			if i%3 == 0 {
				p.annotations[gpu.AnnotationSharing] = "time-slicing"
			}
		}
		names = append(names, p.name)
		go c.createPod(ns, p)
	}
	c.waitBound(ns, names, 120*time.Second)
	t.Logf("200 pods bound in %v", time.Since(start).Round(time.Millisecond))
	nodes := c.recount(invs...)
	whole, shared := 0, 0
	for _, n := range nodes {
		for _, g := range n.GPUs {
			switch g.Mode() {
			case gpu.ModeExclusive:
				whole++
			case gpu.ModeMPS, gpu.ModeTimeSlicing:
				shared++
				if g.CoresUsed() > gpu.CoresPerGPU || float64(g.MemoryUsedMiB()) > 1.5*float64(g.MemoryMiB) {
					t.Errorf("GPU %s over its limits: %d‰ %d MiB", g.UUID, g.CoresUsed(), g.MemoryUsedMiB())
				}
			}
		}
	}
	if whole != 5+10 {
		t.Errorf("%d GPUs held whole, want 15", whole)
	}
	t.Logf("%d GPUs whole, %d shared", whole, shared)
	checkMetrics(t, nodes)
}

// TestDeletionLetsWaitingPodIn: a pod waiting for GPU space is retried as
// soon as a GPU pod leaves or a node's inventory appears — seconds, not the
// five-minute unschedulable flush.
func TestDeletionLetsWaitingPodIn(t *testing.T) {
	c := startCluster(t)
	inv := c.addNode(gpuNode{name: "solo", gpus: 1, memMi: 81920})
	c.startScheduler("")
	// Idle, before any GPU pod: the node's fragmented compute reads 0, not
	// nothing (issue 39: the idle node had no series, the panel no data).
	waitFor(t, 30*time.Second, "solo's free GPUs to be exported", func() bool {
		return gauge(t, "tessera_scheduler_node_free_gpus", map[string]string{"node": "solo"}) == 1
	})
	if frag := gauge(t, "tessera_scheduler_node_fragmented_gpus", map[string]string{"node": "solo"}); frag != 0 {
		t.Errorf("idle node: tessera_scheduler_node_fragmented_gpus = %v, want 0", frag)
	}
	ns := c.namespace("wait")
	c.createPod(ns, podSpec{name: "first", gpus: 1})
	c.waitBound(ns, []string{"first"}, 30*time.Second)
	c.createPod(ns, podSpec{name: "second", gpus: 1})
	waitFor(t, 30*time.Second, "second to be reported unschedulable", func() bool {
		return strings.Contains(c.unschedulableMessage(ns, "second"), "whole")
	})
	t.Logf("second waits: %s", c.unschedulableMessage(ns, "second"))
	// The scheduler's metrics say a GPU pod waits, and why.
	if n := gauge(t, "tessera_scheduler_pending_gpu_pods", map[string]string{"reason": "NotEnoughWholeGPUs"}); n != 1 {
		t.Errorf("tessera_scheduler_pending_gpu_pods{reason=NotEnoughWholeGPUs} = %v, want 1", n)
	}
	// And for how long (TesseraGPUPodsPendingLong reads it): the pod's age.
	second, err := c.client.CoreV1().Pods(ns).Get(c.ctx, "second", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	age := gauge(t, "tessera_scheduler_pending_gpu_pod_age_seconds", map[string]string{"reason": "NotEnoughWholeGPUs"})
	if bound := time.Since(second.CreationTimestamp.Time).Seconds() + 1; age < 0 || age > bound {
		t.Errorf("tessera_scheduler_pending_gpu_pod_age_seconds{reason=NotEnoughWholeGPUs} = %v, want the pod's age, at most %.1f s", age, bound)
	}
	start := time.Now()
	if err := c.client.CoreV1().Pods(ns).Delete(c.ctx, "first", zeroGrace); err != nil {
		t.Fatal(err)
	}
	c.waitBound(ns, []string{"second"}, 30*time.Second)
	t.Logf("waiting pod bound %v after the GPU pod was deleted", time.Since(start).Round(time.Millisecond))
	if n := gauge(t, "tessera_scheduler_pending_gpu_pods", map[string]string{"reason": "NotEnoughWholeGPUs"}); n > 0 {
		t.Errorf("after it was placed, tessera_scheduler_pending_gpu_pods{reason=NotEnoughWholeGPUs} = %v", n)
	}
	c.recount(inv)

	// A node whose agent publishes its inventory late.
	late := nodeInventory(gpuNode{name: "late", gpus: 2, memMi: 81920})
	c.registerNode("late")
	c.createPod(ns, podSpec{name: "third", gpus: 2})
	waitFor(t, 30*time.Second, "third to be reported unschedulable", func() bool { return c.unschedulableMessage(ns, "third") != "" })
	if msg := c.unschedulableMessage(ns, "third"); !strings.Contains(msg, "asks for 2 GPUs on one node, but the node with the most GPUs has 1") {
		t.Errorf("third's message %q does not say no node has 2 GPUs", msg)
	}
	if n := gauge(t, "tessera_scheduler_pending_gpu_pods", map[string]string{"reason": "TooManyGPUs"}); n != 1 {
		t.Errorf("tessera_scheduler_pending_gpu_pods{reason=TooManyGPUs} = %v, want 1", n)
	}
	start = time.Now()
	if _, err := inventory.Publish(c.ctx, c.client, late); err != nil {
		t.Fatal(err)
	}
	c.waitBound(ns, []string{"third"}, 30*time.Second)
	t.Logf("waiting pod bound %v after a node's inventory appeared", time.Since(start).Round(time.Millisecond))
}

// TestMalformedRequestsStayPending: each malformed request gets a reason its
// owner can act on, as the pod's condition and an event, and is not placed.
func TestMalformedRequestsStayPending(t *testing.T) {
	c := startCluster(t)
	c.addNode(gpuNode{name: "m1", gpus: 2, memMi: 81920})
	c.startScheduler("")
	ns := c.namespace("bad")
	cases := map[string]struct {
		pod  podSpec
		want string
	}{
		"cores-150":   {podSpec{gpus: 1, memMi: 8192, cores: 150}, "must be 1–100"},
		"too-big":     {podSpec{gpus: 1, memMi: 200000, cores: 10}, "largest GPU in the cluster has 81920 MiB"},
		"bad-mode":    {podSpec{gpus: 1, annotations: map[string]string{gpu.AnnotationSharing: "mig"}}, "tessera.dev/sharing"},
		"mps-no-size": {podSpec{gpus: 1, annotations: map[string]string{gpu.AnnotationSharing: "mps"}}, "needs"},
		"bad-class":   {podSpec{gpus: 1, memMi: 4096, annotations: map[string]string{gpu.AnnotationWorkload: "batch"}}, "tessera.dev/workload"},
		// Values once taken silently (issue 15): an explicit 0, the
		// preemption settings, and a huge value echoed in full.
		"cores-0":    {podSpec{gpus: 1, memMi: 4096, annotations: map[string]string{}, zeroCores: true}, "tessera.dev/gpu-cores=0: must be 1–100"},
		"bad-grace":  {podSpec{gpus: 1, memMi: 4096, annotations: map[string]string{preemption.AnnotationGrace: "soon"}}, `invalid preemption settings: annotation tessera.dev/checkpoint-grace: "soon" is not a duration`},
		"bad-signal": {podSpec{gpus: 1, memMi: 4096, annotations: map[string]string{preemption.AnnotationSignal: "SIGKILL"}}, `"SIGKILL" is not one of`},
		"bad-url":    {podSpec{gpus: 1, memMi: 4096, annotations: map[string]string{preemption.AnnotationURL: "http://attacker.example:80/"}}, "must be http://:<port>/<path>"},
		"huge-value": {podSpec{gpus: 1, annotations: map[string]string{gpu.AnnotationSharing: strings.Repeat("x", 100_000)}}, "… (100000 bytes): want one of exclusive"},
	}
	for name, tc := range cases {
		tc.pod.name = name
		c.createPod(ns, tc.pod)
	}
	c.createPod(ns, podSpec{name: "good", gpus: 1, memMi: 8192, cores: 10})
	c.waitBound(ns, []string{"good"}, 30*time.Second)

	// Not malformed, but too big for any node's CPU: the node resource check
	// (NodeResourcesFit without the tessera.dev names) still applies.
	big := makePod(ns, podSpec{name: "too-much-cpu", gpus: 1, memMi: 8192, cores: 10})
	big.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("1000")
	if _, err := c.client.CoreV1().Pods(ns).Create(c.ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "too-much-cpu to be reported", func() bool {
		return strings.Contains(c.unschedulableMessage(ns, "too-much-cpu"), "Insufficient cpu")
	})
	// CPU taken by another pod: GPU preemption cannot give it back, so
	// the GPU pod is nominated nowhere (a nomination would hold GPU slices
	// for a pod that cannot run there).
	hog := makePod(ns, podSpec{name: "cpu-hog"})
	hog.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250")}}
	if _, err := c.client.CoreV1().Pods(ns).Create(c.ctx, hog, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitBound(ns, []string{"cpu-hog"}, 30*time.Second)
	crowded := makePod(ns, podSpec{name: "crowded", gpus: 1, memMi: 8192, cores: 10})
	crowded.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = resource.MustParse("10")
	if _, err := c.client.CoreV1().Pods(ns).Create(c.ctx, crowded, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "crowded to be reported", func() bool {
		return strings.Contains(c.unschedulableMessage(ns, "crowded"), "Insufficient cpu")
	})
	// A nomination would come in the same status update as the condition
	// (the scheduler writes both when PostFilter ends).
	if p, err := c.client.CoreV1().Pods(ns).Get(c.ctx, "crowded", metav1.GetOptions{}); err != nil || p.Status.NominatedNodeName != "" {
		t.Errorf("crowded nominated to %q (%v)", p.Status.NominatedNodeName, err)
	}
	for name, tc := range cases {
		waitFor(t, 30*time.Second, name+" to be reported", func() bool { return c.unschedulableMessage(ns, name) != "" })
		msg := c.unschedulableMessage(ns, name)
		if !strings.Contains(msg, tc.want) || len(msg) > 2000 {
			t.Errorf("%s: condition %.300q (%d bytes), want it to say %q", name, msg, len(msg), tc.want)
		}
	}
	waitFor(t, 30*time.Second, "FailedScheduling events", func() bool {
		evs, err := c.client.EventsV1().Events(ns).List(c.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, e := range evs.Items {
			if e.Reason == "FailedScheduling" && e.Type == v1.EventTypeWarning {
				seen[e.Regarding.Name] = true
			}
		}
		for name := range cases {
			if !seen[name] {
				return false
			}
		}
		return true
	})
	pods, err := c.client.CoreV1().Pods(ns).List(c.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if _, bad := cases[p.Name]; bad && p.Spec.NodeName != "" {
			t.Errorf("malformed pod %s was bound to %s", p.Name, p.Spec.NodeName)
		}
	}
}

// TestSchedulerRestartLosesNothing: 64 quarter-GPU pods fill 2 nodes × 8
// GPUs exactly. The scheduler is stopped midway and a new one started: it
// must rebuild the first half's bookings from the pods (forgetting one
// overbooks a GPU, counting one twice leaves a pod pending) and place the
// rest. Then a node's inventory vanishes under bound pods: reported, no crash.
func TestSchedulerRestartLosesNothing(t *testing.T) {
	c := startCluster(t)
	a := c.addNode(gpuNode{name: "r1", gpus: 8, memMi: 81920, mps: true})
	b := c.addNode(gpuNode{name: "r2", gpus: 8, memMi: 81920, mps: true})
	first := c.startScheduler("")
	ns := c.namespace("restart")
	var names []string
	for i := range 64 {
		names = append(names, fmt.Sprintf("q%02d", i))
	}
	for _, n := range names[:32] {
		c.createPod(ns, podSpec{name: n, gpus: 1, memMi: 16384, cores: 25})
	}
	c.waitBound(ns, names[:32], 60*time.Second)
	first.stop()
	for _, n := range names[32:] {
		c.createPod(ns, podSpec{name: n, gpus: 1, memMi: 16384, cores: 25})
	}
	c.startScheduler("")
	bound := c.waitBound(ns, names, 60*time.Second)
	nodes := c.recount(a, b)
	for _, n := range nodes {
		for _, g := range n.GPUs {
			if g.CoresUsed() != gpu.CoresPerGPU || g.Tenants() != 4 {
				t.Errorf("GPU %s holds %d‰ in %d slices, want exactly 4 quarters", g.UUID, g.CoresUsed(), g.Tenants())
			}
		}
	}
	// One more pod must wait: the cluster is exactly full.
	c.createPod(ns, podSpec{name: "extra", gpus: 1, memMi: 16384, cores: 25})
	waitFor(t, 30*time.Second, "extra to be reported unschedulable", func() bool { return c.unschedulableMessage(ns, "extra") != "" })

	// The inventory of r2 vanishes: its 32 pods are orphaned and reported.
	if err := inventory.Withdraw(c.ctx, c.client, "r2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "orphaned pods to be reported", func() bool { return gauge(t, "tessera_scheduler_orphaned_pods", nil) == 32 })
	// The scheduler still works: deleting a pod on r1 lets extra in.
	var onR1 string
	for name, p := range bound {
		if p.Spec.NodeName == "r1" {
			onR1 = name
			break
		}
	}
	if err := c.client.CoreV1().Pods(ns).Delete(c.ctx, onR1, zeroGrace); err != nil {
		t.Fatal(err)
	}
	c.waitBound(ns, []string{"extra"}, 30*time.Second)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestHeldSlotsAreNotPlacedOn: a pod the agent refused (here one bound
// without tessera-scheduler) keeps its kubelet slots until it is deleted.
// The scheduler counts the node's slots as kubelet does (tessera.dev/gpu
// against the node's allocatable), so it does not place a pod kubelet would
// reject with "UnexpectedAdmissionError … Available: 0" (issue 15), and
// places it once the slots are free.
func TestHeldSlotsAreNotPlacedOn(t *testing.T) {
	c := startCluster(t)
	inv := c.addNode(gpuNode{name: "h1", gpus: 2, memMi: 81920, mps: true})
	node, err := c.client.CoreV1().Nodes().Get(c.ctx, "h1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Allocatable[gpu.ResourceGPU] = resource.MustParse("2")
	node.Status.Capacity[gpu.ResourceGPU] = resource.MustParse("2")
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := c.namespace("held")
	rogue := makePod(ns, podSpec{name: "rogue", gpus: 1, memMi: 8192, cores: 10})
	rogue.Spec.SchedulerName = "elsewhere"
	if _, err := c.client.CoreV1().Pods(ns).Create(c.ctx, rogue, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.client.CoreV1().Pods(ns).Bind(c.ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "rogue", Namespace: ns},
		Target: v1.ObjectReference{Kind: "Node", Name: "h1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.startScheduler("")
	c.createPod(ns, podSpec{name: "a", gpus: 1, memMi: 8192, cores: 10})
	c.waitBound(ns, []string{"a"}, 30*time.Second)
	c.createPod(ns, podSpec{name: "b", gpus: 1, memMi: 8192, cores: 10})
	waitFor(t, 30*time.Second, "b to be reported", func() bool { return c.unschedulableMessage(ns, "b") != "" })
	if msg := c.unschedulableMessage(ns, "b"); !strings.Contains(msg, "Insufficient tessera.dev/gpu") {
		t.Fatalf("b: %q, want Insufficient tessera.dev/gpu", msg)
	}
	if p, err := c.client.CoreV1().Pods(ns).Get(c.ctx, "b", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("b bound to %q (%v) with every slot of h1 held", p.Spec.NodeName, err)
	}
	if err := c.client.CoreV1().Pods(ns).Delete(c.ctx, "rogue", zeroGrace); err != nil {
		t.Fatal(err)
	}
	c.waitBound(ns, []string{"b"}, 30*time.Second)
	c.recount(inv)
}
