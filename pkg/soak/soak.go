// Package soak runs Tessera for long under churn while its parts fail: a
// seeded, randomized stream of GPU pods created and deleted (pods that
// finish by themselves, preemptions at three priorities, victims that
// checkpoint, exit or ignore their notice) with faults at random times
// (tessera-scheduler and agents restarted, XIDs and their recovery, MPS
// daemons told to quit, a node removed and re-added) on a playground,
// and an invariant checker (check.go) after every step that reads only what
// a user could read. The same seed replays the same events; their timing
// against the components' is the machine's.
package soak

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// Namespace holds the soak's pods.
const Namespace = "soak"

// OneScheduler is the invariant that at most one tessera-scheduler runs at
// any time (the leader election's promise, with replicas).
const OneScheduler = "one scheduler"

// NothingBooked is the end's invariant that the scheduler books no slice
// once every pod is gone.
const NothingBooked = "nothing booked at the end"

// Options shape a soak.
type Options struct {
	Seed   uint64
	Events int
	// FaultEvery is the mean number of events between faults (0: none).
	FaultEvery int
	// Step is the pause after each event before the checker reads.
	Step time.Duration
	// Bound is how long a pod may take to run, or to wait with the
	// scheduler's reason, and how long the end may take to drain.
	Bound time.Duration
	// MaxPods caps the live pods (deletions take over above it).
	MaxPods int
	// Progress, when set, hears every 100 events.
	Progress func(done, total int)
	// KnownOpen lists invariants whose violations are known and open: they
	// are reported apart (Summary.KnownOpen) and do not fail the soak.
	KnownOpen []string
}

// Summary is a soak's outcome.
type Summary struct {
	Seed       uint64
	Events     map[string]int
	Faults     map[string]int
	Observed   map[string]int
	Checks     int
	Violations []StepViolation
	// KnownOpen are violations of the invariants Options.KnownOpen names.
	KnownOpen []StepViolation
	// ToRunning are creation-to-Running times of pods no fault touched,
	// and of those a fault happened during.
	ToRunning, ToRunningFaulted []time.Duration
	// LongestPendingWithRoom is the longest a pod waited while the
	// allocator found room for it on the nodes as they were.
	LongestPendingWithRoom time.Duration
	LongestPendingPod      string
	// Drain is how long the end took to leave nothing behind.
	Drain time.Duration
	Took  time.Duration
}

// StepViolation is a violation and when it was seen.
type StepViolation struct {
	Step int
	Violation
}

func newSummary(seed uint64) *Summary {
	return &Summary{Seed: seed, Events: map[string]int{}, Faults: map[string]int{}, Observed: map[string]int{}}
}

// shape is one kind of GPU pod the soak asks for.
type shape struct {
	gpus      int
	memoryMiB int64
	cores     int
	sharing   gpu.SharingMode
	workload  gpu.WorkloadClass
}

var shapes = []shape{
	{1, 0, 0, gpu.ModeExclusive, gpu.WorkloadTraining},
	{2, 0, 0, gpu.ModeExclusive, gpu.WorkloadTraining},
	{1, 20480, 40, gpu.ModeMPS, gpu.WorkloadTraining},
	{1, 8192, 20, gpu.ModeMPS, gpu.WorkloadInference},
	{1, 10240, 25, gpu.ModeTimeSlicing, gpu.WorkloadInference},
	{1, 16384, 30, gpu.ModeTimeSlicing, gpu.WorkloadTraining},
	{1, 4096, 10, gpu.ModeAuto, gpu.WorkloadInference},
	{1, 40960, 50, gpu.ModeAuto, gpu.WorkloadTraining},
}

var priorities = []string{"gpu-critical", "gpu-standard", "gpu-batch"}

// Run soaks c. It returns the summary and an error only for a soak that
// could not run (the API server unreachable); violations are in the
// summary.
func Run(ctx context.Context, c *playground.Cluster, opts Options, log io.Writer) (*Summary, error) {
	if opts.Step <= 0 {
		opts.Step = 20 * time.Millisecond
	}
	if opts.Bound <= 0 {
		opts.Bound = 45 * time.Second
	}
	gpus, draNodes := 0, 0
	var nodes []NodeAccess
	for _, n := range c.Nodes {
		gpus += len(n.NVML.Devices)
		nodes = append(nodes, NodeAccess{Name: n.Name, PodResourcesSocket: n.PodResourcesSocket, CDIDir: n.CDIDir})
		if n.DRA {
			draNodes++
		}
	}
	if opts.MaxPods <= 0 {
		opts.MaxPods = 2 * gpus
	}
	// Its own client: the soak reads the cluster after every step, more
	// often than client-go's default rate limit allows.
	rc := rest.CopyConfig(c.Config)
	rc.QPS, rc.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", Namespace, err)
	}
	obs, err := newObserver(client, Namespace, nodes)
	if err != nil {
		return nil, err
	}
	defer obs.close()
	if draNodes > 0 {
		obs.claims = true
		if err := createClaimTemplates(ctx, client); err != nil {
			return nil, err
		}
	}
	cfg := config.Default().Allocator
	chk := &Checker{Oversubscription: cfg.MemoryOversubscription, Grace: 3 * time.Second}
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x7e55e7a))
	sum := newSummary(opts.Seed)
	start := time.Now()
	var faultTimes []time.Time
	created := map[string]time.Time{}
	requests := map[string]*allocator.Request{}
	running := map[string]bool{}
	victims := map[string]bool{}
	pendingRoomSince := map[string]time.Time{}
	sliceCounts := map[string]int{}
	var live []string
	next := 0
	violate := func(step int, vs []Violation) {
		for _, v := range vs {
			if slices.Contains(opts.KnownOpen, v.Invariant) {
				sum.KnownOpen = append(sum.KnownOpen, StepViolation{step, v})
				fmt.Fprintf(log, "known, open (step %d, seed %d): %s\n", step, opts.Seed, v)
				continue
			}
			sum.Violations = append(sum.Violations, StepViolation{step, v})
			fmt.Fprintf(log, "VIOLATION at step %d (seed %d): %s\n", step, opts.Seed, v)
		}
	}
	remove := func(name string) {
		for i, n := range live {
			if n == name {
				live = append(live[:i], live[i+1:]...)
				return
			}
		}
	}

	for step := 1; step <= opts.Events; step++ {
		if ctx.Err() != nil {
			break
		}
		kind := ""
		switch r := rng.IntN(100); {
		case opts.FaultEvery > 0 && rng.IntN(opts.FaultEvery) == 0:
			kind = fault(ctx, c, rng, sum)
			faultTimes = append(faultTimes, time.Now())
		case len(live) < opts.MaxPods && r < 60:
			kind = "create"
			name := fmt.Sprintf("p%05d", next)
			next++
			var pod *v1.Pod
			if draNodes > 0 && rng.IntN(3) == 0 {
				pod = randomClaimPod(rng, name)
				sum.Observed["pod asking with a ResourceClaim"]++
			} else {
				pod = randomPod(rng, name)
			}
			if req, err := podgpu.Request(pod, cfg.MinSliceMiB); err == nil && podgpu.WantsGPU(pod) {
				requests[name] = req
			}
			if _, err := client.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				fmt.Fprintf(log, "step %d: create %s: %v\n", step, name, err)
				kind = "create-refused"
			} else {
				created[name] = time.Now()
				live = append(live, name)
				if pod.Annotations[playground.AnnotationLeftover] != "" {
					sum.Observed["pod whose GPU process will not die"]++
				}
			}
		case len(live) > 0:
			kind = "delete"
			name := live[rng.IntN(len(live))]
			if err := client.CoreV1().Pods(Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				kind = "delete-gone"
			}
			remove(name)
		default:
			kind = "idle"
		}
		sum.Events[kind]++
		time.Sleep(opts.Step)

		s, err := obs.observe(ctx)
		if err != nil && len(s.Pods) == 0 {
			fmt.Fprintf(log, "step %d: %v\n", step, err)
			continue
		}
		sum.Checks++
		violate(step, chk.Safety(s))
		for _, n := range s.Nodes {
			if n.Inventory == nil {
				continue
			}
			for _, d := range n.Inventory.GPUs {
				if prev, ok := sliceCounts[d.UUID]; ok && prev != d.Slices {
					sum.Observed["GPU slice count changed (adjuster, agent restart)"]++
				}
				sliceCounts[d.UUID] = d.Slices
			}
		}
		if n := c.ActiveSchedulers(); n > 1 {
			violate(step, []Violation{{OneScheduler, fmt.Sprintf("%d tessera-schedulers run at once", n)}})
		}
		for _, p := range s.Pods {
			if p.Phase == "Running" && !running[p.Name] {
				running[p.Name] = true
				d := s.At.Sub(created[p.Name])
				if touched(faultTimes, created[p.Name], s.At) {
					sum.ToRunningFaulted = append(sum.ToRunningFaulted, d)
				} else {
					sum.ToRunning = append(sum.ToRunning, d)
				}
			}
			if p.finished() && !p.Deleting {
				if _, counted := created[p.Name]; counted {
					sum.Observed["finished by itself"]++
					delete(created, p.Name)
					remove(p.Name)
					_ = client.CoreV1().Pods(Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
				}
			}
		}
		if step%10 == 0 {
			sum.Checks++
			violate(step, Liveness(s, opts.Bound))
			for _, p := range s.Pods {
				if p.Victim && !victims[p.Name] {
					victims[p.Name] = true
					sum.Observed["preemption victim"]++
				}
			}
			pendingWithRoom(s, requests, pendingRoomSince, sum)
		}
		if opts.Progress != nil && step%100 == 0 {
			opts.Progress(step, opts.Events)
		}
	}
	// The end may take the scheduler's reclaim timeout too: a victim its
	// agent never confirmed reclaimed (it restarted, or its node was
	// re-registered, around the victim's end) keeps its slices booked
	// until then.
	drainStart := time.Now()
	violate(opts.Events, drain(ctx, c, client, obs, chk, opts.Bound+config.Default().Preemption.ReclaimTimeout.Duration, log))
	sum.Checks++
	sum.Drain = time.Since(drainStart)
	if n := schedulerGauge(c.SchedulerMetricsURL, "tessera_scheduler_preemption_reclaim_timeouts_total"); n > 0 {
		sum.Observed["victims released only at the reclaim timeout"] = int(n)
	}
	sum.Took = time.Since(start)
	return sum, nil
}

// touched says whether a fault happened between from and to.
func touched(faults []time.Time, from, to time.Time) bool {
	for _, f := range faults {
		if !f.Before(from) && !f.After(to) {
			return true
		}
	}
	return false
}

// pendingWithRoom tracks how long each unplaced pod has waited while the
// allocator, on the nodes as the State has them, found room for it.
func pendingWithRoom(s State, requests map[string]*allocator.Request, since map[string]time.Time, sum *Summary) {
	cfg := config.Default().Allocator
	a, err := allocator.New(&cfg, nil)
	if err != nil {
		return
	}
	var nodes []*allocator.Node
	for _, n := range s.Nodes {
		if n.Inventory == nil {
			continue
		}
		an, err := allocator.NewNode(n.Inventory)
		if err != nil {
			continue
		}
		for _, p := range s.Pods {
			if p.Node == n.Name && p.Assignment != nil && !p.finished() {
				an.ForceAssignment(p.Assignment, 0, 0)
			}
		}
		nodes = append(nodes, an)
	}
	waiting := map[string]bool{}
	for _, p := range s.Pods {
		if p.Assignment != nil || p.Deleting || p.Node != "" {
			continue
		}
		r := requests[p.Name]
		if r == nil {
			continue
		}
		var pl allocator.Placement
		if a.Choose(nodes, r, &pl) < 0 {
			continue
		}
		waiting[p.Name] = true
		first, ok := since[p.Name]
		if !ok {
			since[p.Name] = s.At
			continue
		}
		if d := s.At.Sub(first); d > sum.LongestPendingWithRoom {
			sum.LongestPendingWithRoom, sum.LongestPendingPod = d, p.Name
		}
	}
	for name := range since {
		if !waiting[name] {
			delete(since, name)
		}
	}
}

// randomPod is a GPU pod of a random shape, class and priority; some finish
// by themselves; each reacts to a preemption notice by exiting,
// checkpointing or ignoring it.
func randomPod(rng *rand.Rand, name string) *v1.Pod {
	sh := shapes[rng.IntN(len(shapes))]
	spec := playground.PodSpec{Name: name, GPUs: sh.gpus, MemoryMiB: sh.memoryMiB, Cores: sh.cores, Sharing: sh.sharing,
		Workload: sh.workload, PriorityClass: priorities[rng.IntN(len(priorities))]}
	pod := spec.Pod(Namespace)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[playground.AnnotationOnPreemption] = []string{"exit", "checkpoint", "ignore"}[rng.IntN(3)]
	if rng.IntN(10) < 3 {
		pod.Annotations[playground.AnnotationRunFor] = strconv.Itoa(2+rng.IntN(10)) + "s"
	}
	if rng.IntN(50) == 0 {
		// A GPU process that will not die: it outlives its container and
		// ignores kill (stuck in the driver). Preempted, its GPU goes out
		// of service and its slices come back only at the reclaim timeout.
		pod.Annotations[playground.AnnotationLeftover] = string(playground.LeftoverUnkillable)
	}
	return pod
}

// claimTemplates are the ResourceClaimTemplates claim pods ask through
// (the chart's gpu.tessera.dev class): a slice, and a whole GPU.
var claimTemplates = map[string]map[resourceapi.QualifiedName]string{
	"soak-slice": {gpu.DRAMemory: "8Gi", gpu.DRACores: "25"},
	"soak-whole": nil,
}

func createClaimTemplates(ctx context.Context, client kubernetes.Interface) error {
	for _, name := range slices.Sorted(maps.Keys(claimTemplates)) {
		req := &resourceapi.ExactDeviceRequest{DeviceClassName: gpu.DRADriver}
		if capacity := claimTemplates[name]; capacity != nil {
			req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
			for k, v := range capacity {
				req.Capacity.Requests[k] = resource.MustParse(v)
			}
		}
		t := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}}
		if _, err := client.ResourceV1().ResourceClaimTemplates(Namespace).Create(ctx, t, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("ResourceClaimTemplate %s: %w", name, err)
		}
	}
	return nil
}

// randomClaimPod is a pod of tessera-scheduler asking through one of the
// claimTemplates, at a random priority, reacting to a preemption notice
// as randomPod's do; some finish by themselves.
func randomClaimPod(rng *rand.Rand, name string) *v1.Pod {
	tmpl := []string{"soak-slice", "soak-whole"}[rng.IntN(2)]
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Annotations: map[string]string{
		playground.AnnotationOnPreemption: []string{"exit", "checkpoint", "ignore"}[rng.IntN(3)]}},
		Spec: v1.PodSpec{SchedulerName: "tessera-scheduler", PriorityClassName: priorities[rng.IntN(len(priorities))],
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}},
			Containers: []v1.Container{{Name: "main", Image: "registry.example/soak",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}}
	if rng.IntN(10) < 3 {
		pod.Annotations[playground.AnnotationRunFor] = strconv.Itoa(2+rng.IntN(10)) + "s"
	}
	return pod
}

// fault injects one fault and names it.
func fault(ctx context.Context, c *playground.Cluster, rng *rand.Rand, sum *Summary) string {
	n := c.Nodes[rng.IntN(len(c.Nodes))]
	var kind string
	var err error
	switch rng.IntN(8) {
	case 0:
		kind = "restart tessera-scheduler"
		var killed string
		killed, err = c.RestartScheduler(ctx)
		if killed != "" || errors.Is(err, playground.ErrNoLeader) {
			kind = "kill the tessera-scheduler leader (a new replica starts)"
		}
	case 1:
		kind = "restart an agent"
		err = n.RestartAgent()
	case 2, 3:
		kind = "XID on a GPU (recovers)"
		n.InjectXid(rng.IntN(len(n.NVML.Devices)), 79)
	case 5:
		kind = "node removed and re-added"
		err = n.Reregister(ctx)
	case 6:
		kind = "restart a node's kubelet"
		err = n.RestartKubelet()
	case 7:
		// An operator's GPU reset ends the processes that would not die;
		// until then their GPUs stay out of service.
		kind = "reset the GPU processes that would not die"
		n.ReleaseStuck()
	case 4:
		var mps []*playground.Node
		for _, m := range c.Nodes {
			if m.MPS {
				mps = append(mps, m)
			}
		}
		if len(mps) == 0 {
			kind = "XID on a GPU (recovers)"
			n.InjectXid(rng.IntN(len(n.NVML.Devices)), 79)
			break
		}
		kind = "MPS daemon told to quit"
		m := mps[rng.IntN(len(mps))]
		err = m.QuitMPS(ctx, rng.IntN(len(m.NVML.Devices)))
	}
	if err != nil {
		kind += " (failed: " + err.Error() + ")"
	}
	sum.Faults[kind]++
	return "fault"
}

// drain deletes every pod and checks that the cluster returns to empty
// within bound: no pod, nothing booked by the scheduler, no CDI spec, no
// notice directory, no MPS daemon but one per MPS-mode GPU, no GPU process
// (those that would not die are reset first).
func drain(ctx context.Context, c *playground.Cluster, client kubernetes.Interface, obs *observer, chk *Checker, bound time.Duration, log io.Writer) []Violation {
	_ = client.CoreV1().Pods(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
	// The GPU processes that would not die end, as an operator's GPU reset
	// ends them: the agents must then reclaim their victims and bring their
	// GPUs back, and nothing may be left.
	for _, n := range c.Nodes {
		if k := n.ReleaseStuck(); k > 0 {
			fmt.Fprintf(log, "drain: node %s: %d GPU process(es) that would not die reset\n", n.Name, k)
		}
	}
	var last []Violation
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, bound, true, func(pctx context.Context) (bool, error) {
		s, err := obs.observe(pctx)
		if err != nil {
			// Unread (the deadline near, a node's kubelet restarting):
			// not an answer, so the last one stands.
			if last == nil {
				last = []Violation{{"drained", err.Error()}}
			}
			return false, nil
		}
		var cur []Violation
		defer func() { last = cur }()
		cur = append(cur, chk.Safety(s)...)
		if len(s.Pods) > 0 {
			var left []string
			for _, p := range s.Pods {
				left = append(left, p.Name+" ("+p.Phase+")")
			}
			cur = append(cur, Violation{"drained", fmt.Sprintf("%d pod(s) left: %v", len(s.Pods), left)})
		}
		if n, where := schedulerSeries(c.SchedulerMetricsURL, "tessera_scheduler_gpu_allocated_slices{"); n != 0 {
			cur = append(cur, Violation{NothingBooked, fmt.Sprintf("the scheduler books %v slice(s) (%s); %v preemption victim pod(s) await their agent's reclaim confirmation",
				n, strings.Join(where, ", "), schedulerGauge(c.SchedulerMetricsURL, "tessera_scheduler_preemption_awaiting_reclaim"))})
		}
		if obs.claims {
			cl, err := client.ResourceV1().ResourceClaims(Namespace).List(pctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			var held []string
			for _, claim := range cl.Items {
				if claim.Status.Allocation != nil {
					held = append(held, claim.Name)
				}
			}
			if len(held) > 0 {
				cur = append(cur, Violation{"drained", fmt.Sprintf("%d claim(s) still allocated: %v", len(held), held)})
			}
		}
		for _, n := range c.Nodes {
			if specs := leftoverSpecs(n.CDIDir); len(specs) > 0 {
				cur = append(cur, Violation{"drained", fmt.Sprintf("node %s keeps CDI specs %v", n.Name, specs)})
			}
			if dirs := n.NoticeDirs(); len(dirs) > 0 {
				cur = append(cur, Violation{"drained", fmt.Sprintf("node %s keeps notice directories %v", n.Name, dirs)})
			}
			if bad := daemonsAmiss(n); bad != "" {
				cur = append(cur, Violation{"drained", fmt.Sprintf("node %s: %s", n.Name, bad)})
			}
			if alive, _ := n.GPUProcesses(); alive > 0 {
				cur = append(cur, Violation{"drained", fmt.Sprintf("node %s has %d GPU process(es) left", n.Name, alive)})
			}
		}
		return len(cur) == 0, nil
	})
	if err != nil {
		fmt.Fprintf(log, "drain: not empty after %v\n", bound)
		return last
	}
	return nil
}

// daemonsAmiss says what is wrong with a node's MPS control daemons: an
// MPS-mode node runs one per GPU (the agent restarts one that quit), any
// other none, and no GPU two (one the agent lost track of).
func daemonsAmiss(n *playground.Node) string {
	daemons, err := n.MPSDaemons()
	if err != nil {
		return "MPS daemons unreadable: " + err.Error()
	}
	var bad []string
	for i := range n.NVML.Devices {
		uuid, _ := n.NVML.Devices[i].GetUUID()
		want := 0
		if n.MPS {
			want = 1
		}
		if got := daemons[uuid]; got != want {
			bad = append(bad, fmt.Sprintf("GPU %s runs %d MPS daemon(s), want %d", uuid, got, want))
		}
		delete(daemons, uuid)
	}
	for uuid, got := range daemons {
		bad = append(bad, fmt.Sprintf("%d MPS daemon(s) for %s, a GPU the node does not have", got, uuid))
	}
	sort.Strings(bad)
	return strings.Join(bad, "; ")
}

// schedulerClient reads the playground scheduler's metrics (HTTPS with a
// self-signed certificate); one for the run, so its connections are reused.
var schedulerClient = &http.Client{Timeout: 5 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the playground's self-signed scheduler

// schedulerGauge sums the scheduler's series whose line starts with prefix
// (-1 when the endpoint cannot be read).
func schedulerGauge(url, prefix string) float64 {
	total, _ := schedulerSeries(url, prefix)
	return total
}

// schedulerSeries sums the scheduler's series whose line starts with prefix
// and returns the lines of those not zero, so a violation says where.
func schedulerSeries(url, prefix string) (float64, []string) {
	resp, err := schedulerClient.Get(url)
	if err != nil {
		return -1, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1, nil
	}
	var total float64
	var nonzero []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			if v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64); err == nil {
				total += v
				if v != 0 {
					nonzero = append(nonzero, line)
				}
			}
		}
	}
	return total, nonzero
}

// Render prints the summary.
func (s *Summary) Render(w io.Writer) {
	fmt.Fprintf(w, "soak seed %d: %d events in %v, %d checks, %d violation(s)\n", s.Seed, total(s.Events), s.Took.Round(time.Second), s.Checks, len(s.Violations))
	section := func(title string, m map[string]int) {
		fmt.Fprintf(w, "%s:\n", title)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %-40s %6d\n", k, m[k])
		}
	}
	section("events", s.Events)
	section("faults", s.Faults)
	section("observed", s.Observed)
	fmt.Fprintf(w, "creation to Running: %s without a fault in between; %s with one\n", percentiles(s.ToRunning), percentiles(s.ToRunningFaulted))
	if s.LongestPendingPod != "" {
		fmt.Fprintf(w, "longest wait while the allocator found room: %v (%s)\n", s.LongestPendingWithRoom.Round(time.Millisecond), s.LongestPendingPod)
	} else {
		fmt.Fprintln(w, "no pod waited while the allocator found room")
	}
	fmt.Fprintf(w, "drained in %v\n", s.Drain.Round(time.Second))
	for _, v := range s.KnownOpen {
		fmt.Fprintf(w, "known, open: step %d: %s\n", v.Step, v.Violation)
	}
	for _, v := range s.Violations {
		fmt.Fprintf(w, "VIOLATION step %d: %s (replay: --seed %d)\n", v.Step, v.Violation, s.Seed)
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration { return s[int(p*float64(len(s)-1))] }
	return fmt.Sprintf("p50 %v, p99 %v (%d pods)", q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), len(s))
}
