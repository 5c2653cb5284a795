package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/pkg/agent/isolation"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// isolationNode is an agent on a DGX H100 mock whose GPUs offer kernel
// memory limits except the last, a cgroup v2 root in a scratch directory,
// and the node's pods.
type isolationNode struct {
	a        *Agent
	root     string
	uuids    []string
	readings []*nvmltest.Reading
	mu       sync.Mutex
	pods     []*v1.Pod
}

func newIsolationNode(t *testing.T) *isolationNode {
	t.Helper()
	return newIsolationNodeWith(t, nil)
}

// newIsolationNodeWith is newIsolationNode with the agent's options
// changed by with (nil: none).
func newIsolationNodeWith(t *testing.T, with func(*Options)) *isolationNode {
	t.Helper()
	n := &isolationNode{root: t.TempDir()}
	srv := dgxh100.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		r := &nvmltest.Reading{KernelLimits: i < len(srv.Devices)-1}
		n.readings = append(n.readings, r)
		return r
	})
	for _, d := range srv.Devices {
		u, _ := d.GetUUID()
		n.uuids = append(n.uuids, u)
	}
	if err := os.WriteFile(filepath.Join(n.root, "cgroup.controllers"), []byte("cpuset cpu io memory pids dmem\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(n.root, "kubepods.slice"), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{Node: "n1", Config: config.Default(), Client: newNode(), NVML: srv, CgroupRoot: n.root,
		NodePods: func() []*v1.Pod { n.mu.Lock(); defer n.mu.Unlock(); return append([]*v1.Pod(nil), n.pods...) }}
	if with != nil {
		with(&opts)
	}
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	n.a = a
	return n
}

// podCgroup makes a pod's cgroup as kubelet's systemd driver names a
// burstable pod's, and returns it.
func podCgroup(t *testing.T, root string, uid types.UID) string {
	t.Helper()
	cg := filepath.Join(root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+strings.ReplaceAll(string(uid), "-", "_")+".slice")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	return cg
}

// pod adds a running pod with one container's grant; withCgroup makes its
// cgroup (kubelet's systemd layout, burstable) and returns its container's.
func (n *isolationNode) pod(t *testing.T, name string, mode gpu.SharingMode, g gpu.GPUGrant, withCgroup bool) (*v1.Pod, string) {
	t.Helper()
	uid := types.UID("0c6e1a9a-3a9e-4f0e-9a55-" + strings.Repeat(string(name[len(name)-1]), 12))
	enc, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: mode, GPUs: []gpu.GPUGrant{g}}}})
	if err != nil {
		t.Fatal(err)
	}
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: name, UID: uid, Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
		Spec: v1.PodSpec{NodeName: "n1", SchedulerName: "tessera-scheduler", Containers: []v1.Container{{Name: "main"}}}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	if _, err := n.a.opts.Client.CoreV1().Pods("lab").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.pods = append(n.pods, p)
	n.mu.Unlock()
	ctr := ""
	if withCgroup {
		u := strings.ReplaceAll(string(uid), "-", "_")
		ctr = filepath.Join(n.root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+u+".slice", "cri-containerd-"+strings.Repeat("ab", 32)+".scope")
		if err := os.MkdirAll(ctr, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return p, ctr
}

func (n *isolationNode) end(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.pods {
		if p.Name == name {
			p.Status.Phase = v1.PodSucceeded
		}
	}
}

const gib = uint64(1) << 30

// TestKernelMemoryLimitsHoldTimeSlicedSlices: on GPUs whose driver offers
// NVML's cgroup memory limits, a starting time-sliced container's pod gets
// a hard limit of its grant before the container exists, and an allocation
// past it fails with an out-of-memory error while one within it succeeds;
// the GPU without the feature reports why and its slices say "none"; a pod
// whose cgroup is missing is refused; the limits of an ended pod and one
// left behind by a crashed agent are removed; the guarantee is in the
// inventory, on the pod and in the metric.
func TestKernelMemoryLimitsHoldTimeSlicedSlices(t *testing.T) {
	ctx := context.Background()
	n := newIsolationNode(t)
	last := len(n.uuids) - 1

	inv := n.a.Inventory(time.Now())
	if o := inv.GPUs[0].Offer(); !o.KernelMemoryLimits || o.MPSLimits {
		t.Fatalf("GPU 0 offers %+v, want kernel memory limits", o)
	}
	if o := inv.GPUs[last].Offer(); o.KernelMemoryLimits || !strings.Contains(o.Why, "kernel memory limits:") {
		t.Fatalf("GPU %d (no driver support) offers %+v, want none with the reason", last, o)
	}

	train, trainCtr := n.pod(t, "train-1", gpu.ModeTimeSlicing, gpu.GPUGrant{UUID: n.uuids[0], MemoryMiB: 20 << 10, CoresPerMille: 500}, true)
	_, _ = n.pod(t, "infer-2", gpu.ModeTimeSlicing, gpu.GPUGrant{UUID: n.uuids[0], MemoryMiB: 40 << 10, CoresPerMille: 500}, true)
	gs, err := n.a.enforcer.Isolate(ctx, train, gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: n.uuids[0], MemoryMiB: 20 << 10, CoresPerMille: 500}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := (gpu.Guarantee{Memory: gpu.MechanismKernel, Compute: gpu.MechanismNone}); len(gs) != 1 || gs[0] != want {
		t.Fatalf("guarantees %v, want %v", gs, want)
	}
	lim := n.readings[0].Limits
	podCg := filepath.Dir(trainCtr)
	if soft, hard, ok := lim.Limit(podCg); !ok || hard != 20*gib || soft != 20*gib {
		t.Fatalf("pod cgroup limits soft %d hard %d (set %v), want 20 GiB both", soft, hard, ok)
	}
	// The tenant's processes live in the container's cgroup, below the
	// pod's: the driver holds them to the pod's limit.
	if err := lim.Allocate(trainCtr, 19*gib); err != nil {
		t.Fatalf("an allocation within the grant failed: %v", err)
	}
	if err := lim.Allocate(trainCtr, 2*gib); !errors.Is(err, nvmltest.ErrOutOfMemory) {
		t.Fatalf("an allocation past the grant = %v, want out of memory", err)
	}
	lim.Free(trainCtr)

	// The GPU without the feature: the slice is only accounted, and says so.
	noLimits, _ := n.pod(t, "old-3", gpu.ModeTimeSlicing, gpu.GPUGrant{UUID: n.uuids[last], MemoryMiB: 8 << 10, CoresPerMille: 250}, true)
	gs, err = n.a.enforcer.Isolate(ctx, noLimits, gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: n.uuids[last], MemoryMiB: 8 << 10, CoresPerMille: 250}}})
	if err != nil || gs[0].Memory != gpu.MechanismNone {
		t.Fatalf("on a GPU without kernel limits: %v, %v; want memory=none", gs, err)
	}

	// No cgroup: the container is refused, not run unlimited.
	lost, _ := n.pod(t, "lost-4", gpu.ModeTimeSlicing, gpu.GPUGrant{UUID: n.uuids[1], MemoryMiB: 8 << 10, CoresPerMille: 250}, false)
	if _, err := n.a.enforcer.Isolate(ctx, lost, gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: n.uuids[1], MemoryMiB: 8 << 10, CoresPerMille: 250}}}); err == nil || !strings.Contains(err.Error(), "cgroup was not found") {
		t.Fatalf("a pod without a cgroup: %v, want refused", err)
	}

	// The pod condition and the metric say what holds each slice.
	if c := isolationCondition(t, n.a, "lab", "train-1"); c.Status != v1.ConditionFalse || !strings.Contains(c.Message, "main on "+n.uuids[0]+": memory=kernel,compute=none") {
		t.Errorf("condition %+v", c)
	}
	mech := isolationSeries(t, n.a)
	if got := mech["train-1/"+n.uuids[0]+"/memory"]; got != "kernel" {
		t.Errorf("tessera_slice_isolation for train-1 memory = %q, want kernel (all: %v)", got, mech)
	}
	if got := mech["old-3/"+n.uuids[last]+"/memory"]; got != "none" {
		t.Errorf("tessera_slice_isolation for old-3 memory = %q, want none", got)
	}
	// The grants, for the tenants' usage to be read against.
	grants := grantSeries(t, n.a)
	if got, want := grants["train-1/main/"+n.uuids[0]], fmt.Sprintf("%d/0.50", 20*gib); got != want {
		t.Errorf("train-1's grant series = %q, want %q (all: %v)", got, want, grants)
	}
	if got, want := grants["old-3/main/"+n.uuids[last]], fmt.Sprintf("%d/0.25", 8*gib); got != want {
		t.Errorf("old-3's grant series = %q, want %q", got, want)
	}

	// A crashed agent's leftover on a pod that holds no GPU any more, and
	// an ended pod whose cgroup lingers: both cleared; the running pod
	// keeps its limit.
	_, strayCtr := n.pod(t, "stray-5", gpu.ModeTimeSlicing, gpu.GPUGrant{UUID: n.uuids[2], MemoryMiB: 1 << 10, CoresPerMille: 100}, true)
	n.end("stray-5")
	if err := n.a.gpus.SetMemoryLimits(n.uuids[0], filepath.Dir(strayCtr), gib, gib); err != nil {
		t.Fatal(err)
	}
	n.end("infer-2")
	n.a.enforcer.Reconcile(ctx)
	if _, _, ok := lim.Limit(filepath.Dir(strayCtr)); ok {
		t.Error("the crashed agent's leftover limit was not removed")
	}
	for _, cg := range lim.Cgroups() {
		if !strings.Contains(cg, strings.ReplaceAll(string(train.UID), "-", "_")) {
			t.Errorf("a limit is left on %s; only train-1's should remain", cg)
		}
	}
	if _, hard, ok := lim.Limit(podCg); !ok || hard != 20*gib {
		t.Errorf("the running pod's limit was lost: hard %d, set %v", hard, ok)
	}
}

// isolationCondition waits for the pod's GPUIsolation condition and
// returns it.
func isolationCondition(t *testing.T, a *Agent, ns, name string) v1.PodCondition {
	t.Helper()
	var got v1.PodCondition
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := a.opts.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == isolation.ConditionGPUIsolation {
				got = c
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no %s condition on pod %s/%s: %v", isolation.ConditionGPUIsolation, ns, name, err)
	}
	return got
}

// gatherIsolation gathers what the isolation collector exports.
func gatherIsolation(t *testing.T, a *Agent) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.enforcer.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// isolationSeries reads tessera_slice_isolation: pod/gpu/dimension →
// mechanism.
func isolationSeries(t *testing.T, a *Agent) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, mf := range gatherIsolation(t, a) {
		if mf.GetName() != "tessera_slice_isolation" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			out[l["pod"]+"/"+l["UUID"]+"/"+l["dimension"]] = l["mechanism"]
		}
	}
	return out
}

// grantSeries reads the grants the agent exports: pod/container/UUID →
// "memory bytes/cores ratio".
func grantSeries(t *testing.T, a *Agent) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, mf := range gatherIsolation(t, a) {
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			k := l["pod"] + "/" + l["container"] + "/" + l["UUID"]
			switch mf.GetName() {
			case "tessera_container_gpu_memory_granted_bytes":
				out[k] = fmt.Sprintf("%.0f", m.GetGauge().GetValue()) + out[k]
			case "tessera_container_gpu_cores_granted_ratio":
				out[k] += fmt.Sprintf("/%.2f", m.GetGauge().GetValue())
			}
		}
	}
	return out
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// TestMPSGuaranteesFollowConnectTime: the agent sets each MPS GPU's server
// to the tightest limits its tenants allow, and claims a tenant is held by
// the server only when the server's limits when that tenant connected were
// within its grant — a client keeps the limits it connected under. Run on
// the MPS stand-in (testdata/fakecontrol), which keeps the limits as MPS
// documents them.
func TestMPSGuaranteesFollowConnectTime(t *testing.T) {
	ctx := context.Background()
	srv, n, a := mpsAgent(t, nil)
	uuid, _ := srv.Devices[0].GetUUID()
	start := func(name string, cores int, mem int64) gpu.Guarantee {
		t.Helper()
		g := gpu.GPUGrant{UUID: uuid, MemoryMiB: mem, CoresPerMille: 10 * cores}
		p, _ := n.pod(t, name, gpu.ModeMPS, g, false)
		gs, err := a.enforcer.Isolate(ctx, p, gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{g}})
		if err != nil || len(gs) != 1 {
			t.Fatalf("%s: %v, %v", name, gs, err)
		}
		return gs[0]
	}
	now := func(name string) gpu.Guarantee {
		t.Helper()
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, p := range n.pods {
			if gs := a.enforcer.SliceGuarantees(p); p.Name == name && len(gs) > 0 && !podgpu.Finished(p) {
				return gs[0].Guarantee
			}
		}
		t.Fatalf("%s not active", name)
		return gpu.Guarantee{}
	}
	server := func() gpu.MPSServerLimits { l, _ := a.mpsMgr.ServerLimits(uuid); return l }
	held := gpu.Guarantee{Memory: gpu.MechanismMPSServer, Compute: gpu.MechanismMPSServer}
	cooperating := gpu.Guarantee{Memory: gpu.MechanismMPSClient, Compute: gpu.MechanismMPSClient}

	if g := start("small-1", 30, 4096); g != held || server() != (gpu.MPSServerLimits{ThreadPercent: 30, MemoryMiB: 4096}) {
		t.Fatalf("alone: %v, server %+v; want held by a server at its grant", g, server())
	}
	if g := start("big-2", 70, 16384); g != held || server() != (gpu.MPSServerLimits{ThreadPercent: 70, MemoryMiB: 16384}) {
		t.Fatalf("larger tenant: %v, server %+v; want the server raised to its grant", g, server())
	}
	if g := now("small-1"); g != held {
		t.Errorf("small-1 connected under 30 %%/4 GiB and keeps them: %v, want %v", g, held)
	}
	if g := start("mid-3", 50, 8192); g != cooperating {
		t.Errorf("a tenant below the server's limits: %v, want %v (held only by its variables)", g, cooperating)
	}
	// big-2 leaves: the server is lowered for new clients; mid-3 keeps
	// the 70 % it connected under, so nothing more is claimed for it.
	n.end("big-2")
	a.enforcer.Reconcile(ctx)
	if got := server(); got != (gpu.MPSServerLimits{ThreadPercent: 50, MemoryMiB: 8192}) {
		t.Errorf("server after big-2 left: %+v, want 50 %% / 8192 MiB", got)
	}
	if g := now("mid-3"); g != cooperating {
		t.Errorf("mid-3 after the server was lowered: %v, want %v", g, cooperating)
	}
	if g := start("late-4", 50, 8192); g != held {
		t.Errorf("a tenant connecting under the lowered server: %v, want %v", g, held)
	}
	if out, err := a.mpsMgr.Control(ctx, uuid, "get_default_active_thread_percentage"); err != nil || out != "50" {
		t.Errorf("the daemon's default active thread percentage: %q, %v", out, err)
	}

	// A tenant lifts the limits through the control endpoint (issue 38).
	// The next check reads them back, restores them, and reports it; late-4
	// may have connected under the lifted limits since the last check, so
	// it is claimed held no more.
	tamper := func() {
		t.Helper()
		pid, err := a.mpsMgr.Control(ctx, uuid, "get_server_list")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"set_default_active_thread_percentage 100", "set_default_device_pinned_mem_limit 0 81920M",
			"set_active_thread_percentage " + pid + " 100", "set_device_pinned_mem_limit " + pid + " 0 81920M"} {
			if out, err := a.mpsMgr.Control(ctx, uuid, c); err != nil {
				t.Fatalf("%s: %v: %s", c, err, out)
			}
		}
	}
	changes := func() float64 {
		return gpuSeries(t, a, "tessera_mps_limit_changes_total", uuid)
	}
	before := changes()
	tamper()
	a.mpsMgr.Check(ctx)
	if out, _ := a.mpsMgr.Control(ctx, uuid, "get_default_active_thread_percentage"); out != "50" {
		t.Errorf("after the check the default active thread percentage is %q, want 50 restored", out)
	}
	if d := changes() - before; d != 1 {
		t.Errorf("tessera_mps_limit_changes_total rose by %v, want 1", d)
	}
	if g := now("late-4"); g != cooperating {
		t.Errorf("late-4 after its GPU's limits were found lifted: %v, want %v", g, cooperating)
	}
	note := ""
	for _, e := range waitEvents(t, a.opts.Client, metav1.NamespaceDefault, eventWith("MPSLimitsRestored", a.opts.Node)) {
		if e.Reason == "MPSLimitsRestored" {
			note = e.Message
		}
	}
	for _, want := range []string{"MPS limits of GPU " + uuid + " changed by someone other than this node's tessera-agent",
		"get_default_active_thread_percentage: 100 %, want 50 %", "get_default_device_pinned_mem_limit 0: 81920 MiB, want 8192 MiB", "restored"} {
		if !strings.Contains(note, want) {
			t.Errorf("MPSLimitsRestored event %q lacks %q", note, want)
		}
	}
	// Lifted again just before a tenant starts: its start reads them back
	// and restores them before it connects, so it is held.
	tamper()
	if g := start("late-5", 50, 8192); g != held {
		t.Errorf("a tenant starting after the limits were lifted and restored: %v, want %v", g, held)
	}
	if d := changes() - before; d != 2 {
		t.Errorf("tessera_mps_limit_changes_total rose by %v, want 2", d)
	}

	// The agent restarts: what it recorded is gone; a pod's condition
	// carries it, and a pod without one is not claimed held.
	n.mu.Lock()
	for _, p := range n.pods {
		if p.Name == "late-4" {
			p.Status.Conditions = []v1.PodCondition{{Type: isolation.ConditionGPUIsolation, Message: "main on " + uuid + ": memory=mps-server,compute=mps-server"}}
		}
	}
	n.mu.Unlock()
	a.enforcer = a.newEnforcer() // as a restarted agent's: no record of connect times
	a.enforcer.Probe(ctx)
	if g := now("late-4"); g != held {
		t.Errorf("late-4 from its condition after a restart: %v, want %v", g, held)
	}
	if g := now("small-1"); g != cooperating {
		t.Errorf("small-1 without a record after a restart: %v, want %v", g, cooperating)
	}
}

// mpsAgent is an agent on a DGX H100 mock (its options changed by with,
// when set) with its MPS daemons started through the MPS stand-in
// (testdata/fakecontrol), which keeps the limits as MPS documents them,
// stopped when the test ends; and its node's pods.
func mpsAgent(t *testing.T, with func(*Options)) (*server.Server, *isolationNode, *Agent) {
	t.Helper()
	srv, n, opts := mpsNode(t)
	if with != nil {
		with(&opts)
	}
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	n.a = a
	if err := a.mpsMgr.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.mpsMgr.Stop(context.Background()) })
	return srv, n, a
}

func mpsNode(t *testing.T) (*server.Server, *isolationNode, Options) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if out, err := exec.Command("go", "build", "-o", bin, "./mps/testdata/fakecontrol").CombinedOutput(); err != nil {
		t.Fatalf("building the MPS stand-in: %v\n%s", err, out)
	}
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
	n := &isolationNode{}
	return srv, n, Options{Node: "n1", Config: config.Default(), Client: newNode(), NVML: srv, MPS: true, MPSBinary: bin, MPSRoot: t.TempDir(),
		NodePods: func() []*v1.Pod { n.mu.Lock(); defer n.mu.Unlock(); return append([]*v1.Pod(nil), n.pods...) }}
}

// TestShimHoldsWhatTheDriverCannot: on GPUs without kernel memory limits
// (R580), an agent given a shim directory offers libtessera: a time-sliced
// slice is held by it in both dimensions and an MPS GPU's offer has it too;
// the library is installed where containers get it. An agent whose library
// is missing offers none and says why; one given no directory says so.
func TestShimHoldsWhatTheDriverCannot(t *testing.T) {
	ctx := context.Background()
	lib := filepath.Join(t.TempDir(), "libtessera.so")
	if err := os.WriteFile(lib, []byte("library"), 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(shimRoot, library string) (*Agent, []string) {
		srv := dgxh100.New()
		nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
		var uuids []string
		for _, d := range srv.Devices {
			u, _ := d.GetUUID()
			uuids = append(uuids, u)
		}
		a, err := New(Options{Node: "n1", Config: config.Default(), Client: newNode(), NVML: srv, ShimRoot: shimRoot, ShimLibrary: library})
		if err != nil {
			t.Fatal(err)
		}
		return a, uuids
	}
	root := filepath.Join(t.TempDir(), "shim")
	a, uuids := start(root, lib)
	if o := a.Inventory(time.Now()).GPUs[0].Offer(); !o.Shim || o.KernelMemoryLimits || strings.Contains(o.Why, "shim") {
		t.Fatalf("GPU 0 offers %+v, want libtessera and no kernel limits", o)
	}
	if b, err := os.ReadFile(filepath.Join(root, "libtessera.so")); err != nil || string(b) != "library" {
		t.Errorf("the library in the shim directory: %q, %v", b, err)
	}
	g := gpu.GPUGrant{UUID: uuids[0], MemoryMiB: 8 << 10, CoresPerMille: 300}
	enc, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{g}}}})
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "infer", UID: "uid-infer", Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
		Spec: v1.PodSpec{NodeName: "n1", SchedulerName: "tessera-scheduler", Containers: []v1.Container{{Name: "main"}}}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	gs, err := a.enforcer.Isolate(ctx, pod, gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{g}})
	if want := (gpu.Guarantee{Memory: gpu.MechanismShim, Compute: gpu.MechanismShim}); err != nil || len(gs) != 1 || gs[0] != want {
		t.Fatalf("guarantees %v, %v; want %v", gs, err, want)
	}

	a, _ = start(filepath.Join(t.TempDir(), "shim"), filepath.Join(t.TempDir(), "missing.so"))
	if o := a.Inventory(time.Now()).GPUs[0].Offer(); o.Shim || !strings.Contains(o.Why, "shim: libtessera not found at") {
		t.Errorf("with the library missing GPU 0 offers %+v, want no shim and the reason", o)
	}
	a, _ = start("", "")
	if o := a.Inventory(time.Now()).GPUs[0].Offer(); o.Shim || !strings.Contains(o.Why, "shim: the agent was given no --shim-dir") {
		t.Errorf("without a shim directory GPU 0 offers %+v, want no shim and the reason", o)
	}
}
