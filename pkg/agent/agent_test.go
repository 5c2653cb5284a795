package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

func newNode() *fake.Clientset {
	res := v1.ResourceList{v1.ResourceCPU: resource.MustParse("96"), v1.ResourceMemory: resource.MustParse("1Ti")}
	return fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1.NodeStatus{Allocatable: res, Capacity: res}})
}

func published(t *testing.T, c *fake.Clientset) *gpu.NodeInventory {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.FromNode(n)
	if err != nil || inv == nil {
		t.Fatalf("inventory %v, %v", inv, err)
	}
	return inv
}

// startedAgent is an agent on a DGX H100 mock whose GPUs all read r, with
// its node in a fake API server.
func startedAgent(t *testing.T, r *nvmltest.Reading) (*server.Server, *fake.Clientset, *Agent) {
	t.Helper()
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { c := *r; return &c })
	client := newNode()
	a, err := New(Options{Node: "n1", Config: config.Default(), Client: client, NVML: srv, CDIDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return srv, client, a
}

// TestFaultsReachTheInventory: the agent publishes its GPUs as the scheduler
// reads them; an XID takes a GPU out in the published inventory at once and
// it returns after the quiet period.
func TestFaultsReachTheInventory(t *testing.T) {
	_, client, a := startedAgent(t, &nvmltest.Reading{SMCount: 132, NVLink: true})
	cfg, ctx, t0 := a.opts.Config, context.Background(), time.Now()
	if err := a.Refresh(ctx, t0); err != nil {
		t.Fatal(err)
	}
	inv := published(t, client)
	if len(inv.GPUs) != 8 || inv.CPUMilli != 96000 || inv.MemoryMiB != 1<<20 {
		t.Fatalf("published %d GPUs, %d mCPU, %d MiB", len(inv.GPUs), inv.CPUMilli, inv.MemoryMiB)
	}
	for _, g := range inv.GPUs {
		if !g.Healthy || g.MemoryMiB != 81920 || g.SMCount != 132 || len(g.NVLinkPeers) != 7 || g.MPSCapable {
			t.Fatalf("GPU %+v", g)
		}
	}
	uuid2 := inv.GPUs[2].UUID
	a.Observe(ctx, nvml.Event{UUID: uuid2, Type: gonvml.EventTypeXidCriticalError, Xid: 79}, t0.Add(time.Second))
	if inv := published(t, client); inv.GPUs[2].Healthy || !inv.GPUs[1].Healthy {
		t.Fatalf("after XID 79 on GPU 2: %+v", inv.GPUs[:3])
	}
	// An application XID changes nothing.
	a.Observe(ctx, nvml.Event{UUID: inv.GPUs[4].UUID, Type: gonvml.EventTypeXidCriticalError, Xid: 13}, t0.Add(2*time.Second))
	if inv := published(t, client); !inv.GPUs[4].Healthy {
		t.Fatal("XID 13 took GPU 4 out")
	}
	if err := a.Refresh(ctx, t0.Add(time.Second+cfg.Health.QuietPeriod.Duration)); err != nil {
		t.Fatal(err)
	}
	if inv := published(t, client); !inv.GPUs[2].Healthy {
		t.Fatal("GPU 2 did not return after the quiet period")
	}
}

func TestNoDriver(t *testing.T) {
	srv := dgxh100.New()
	srv.InitFunc = func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }
	client := newNode()
	if _, err := New(Options{Node: "n1", Config: config.Default(), Client: client, NVML: srv}); !errors.Is(err, nvml.ErrNoDriver) {
		t.Fatalf("New without a driver = %v, want ErrNoDriver", err)
	}
	a, err := New(Options{Node: "n1", Config: config.Default(), Client: client, NVML: srv, AllowNoGPU: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	inv := published(t, client)
	if len(inv.GPUs) != 0 {
		t.Fatalf("an empty node published %d GPUs", len(inv.GPUs))
	}
	// The doctor tells the operator why from the inventory.
	if !strings.Contains(inv.NoGPU, "NVML is not available") {
		t.Fatalf("the empty node's inventory says noGPU %q, want NVML's error", inv.NoGPU)
	}
}

func TestSlicesAllocatedFollowAssignments(t *testing.T) {
	srv := dgxh100.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
	uuid, _ := srv.Devices[0].GetUUID()
	enc, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{
		{Name: "a", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{{UUID: uuid, MemoryMiB: 4096, CoresPerMille: 100}}},
		{Name: "b", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{{UUID: uuid, MemoryMiB: 4096, CoresPerMille: 100}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
		Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "a"}, {Name: "b"}}}}
	a, err := New(Options{Node: "n1", Config: config.Default(), Client: newNode(), NVML: srv, NodePods: func() []*v1.Pod { return []*v1.Pod{pod} }})
	if err != nil {
		t.Fatal(err)
	}
	if c := a.slices()[uuid]; c.Total != 8 || c.Allocated != 2 {
		t.Fatalf("slices = %d total, %d allocated; want 8 (fragments.maxSlices) and 2", c.Total, c.Allocated)
	}
}

// TestForecastLoadLowersTheSliceCount: a GPU busy at 95 % for the whole
// window is cut into fewer slices after fragments.consecutive evaluations
// above 85 %, and the scheduler's inventory carries the new count; an idle
// GPU at the most slices stays there.
func TestForecastLoadLowersTheSliceCount(t *testing.T) {
	srv, client, a := startedAgent(t, &nvmltest.Reading{})
	cfg, ctx, t0 := a.opts.Config, context.Background(), time.Now()
	if err := a.Refresh(ctx, t0); err != nil {
		t.Fatal(err)
	}
	busy, _ := srv.Devices[0].GetUUID()
	idle, _ := srv.Devices[1].GetUUID()
	step := cfg.Fragments.SampleInterval.Duration
	window := int(cfg.Fragments.Window.Duration / step)
	perEval := int(cfg.Fragments.EvaluateEvery.Duration / step)
	var changedAt time.Duration
	for i := range window + (cfg.Fragments.Consecutive+1)*perEval {
		now := t0.Add(time.Duration(i) * step)
		// A little noise: a constant series has nothing to fit.
		a.Adjust(ctx, map[string]float64{busy: 0.95 + 0.01*float64(i%3), idle: 0.05 + 0.01*float64(i%2)}, now)
		if a.slicesOf(busy) != cfg.Fragments.MaxSlices {
			changedAt = now.Sub(t0)
			break
		}
	}
	if min := time.Duration(cfg.Fragments.Consecutive-1) * cfg.Fragments.EvaluateEvery.Duration; changedAt < min {
		t.Fatalf("changed after %v, before %d evaluations above the threshold", changedAt, cfg.Fragments.Consecutive)
	}
	if got := a.slicesOf(busy); got != cfg.Fragments.MaxSlices-1 {
		t.Fatalf("busy GPU has %d slices, want %d", got, cfg.Fragments.MaxSlices-1)
	}
	t.Logf("busy GPU lost a slice %v after its first sample", changedAt)
	if got := a.slicesOf(idle); got != cfg.Fragments.MaxSlices {
		t.Fatalf("idle GPU has %d slices, want %d", got, cfg.Fragments.MaxSlices)
	}
	one := func(evs []v1.Event) bool { return len(evs) == 1 && eventWith("ForecastAboveThreshold", "n1")(evs) }
	if evs := waitEvents(t, client, metav1.NamespaceDefault, one); !one(evs) {
		t.Fatalf("events %+v; want one ForecastAboveThreshold on node n1", evs)
	}
	inv := published(t, client)
	if inv.GPUs[0].Slices != cfg.Fragments.MaxSlices-1 || inv.GPUs[1].Slices != cfg.Fragments.MaxSlices {
		t.Fatalf("published slices %d and %d", inv.GPUs[0].Slices, inv.GPUs[1].Slices)
	}
}

// failingSlicer refuses every class, as nvidia-smi does on a GPU that
// does not support compute policies.
type failingSlicer struct{ calls int }

func (f *failingSlicer) SetTimeslice(context.Context, string, timeslice.Class) error {
	f.calls++
	return errors.New("Setting timeslice is not supported")
}

// TestTimeSharedGPUsGetTheirClass: on a time-sliced node every GPU is put in
// the default compute mode and given the compute-bound class; a GPU that
// takes an inference tenant moves to the IO-bound class, and back when the
// tenant leaves. A GPU whose class cannot be set is reported and retried no
// sooner than a minute later.
func TestTimeSharedGPUsGetTheirClass(t *testing.T) {
	srv := dgxh100.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		if i == 1 {
			return &nvmltest.Reading{ComputeMode: gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS}
		}
		return &nvmltest.Reading{}
	})
	uuid0, _ := srv.Devices[0].GetUUID()
	uuid1, _ := srv.Devices[1].GetUUID()
	pod := func(name, workload string, uuid string) *v1.Pod {
		enc, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{
			{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: uuid, MemoryMiB: 8192, CoresPerMille: 250}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Annotations: map[string]string{
			gpu.AnnotationAssignment: enc, gpu.AnnotationWorkload: workload}},
			Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "main"}}}}
	}
	pods := []*v1.Pod{pod("train", "training", uuid0)}
	rec := &timeslice.Recorder{}
	ctx, t0 := context.Background(), time.Now()
	a, err := New(Options{Node: "n1", Config: config.Default(), Client: newNode(), NVML: srv, TimeSlicer: rec,
		NodePods: func() []*v1.Pod { return pods }})
	if err != nil {
		t.Fatal(err)
	}
	timeslice.Prepare(ctx, a.gpus, a.devices)
	if m, _ := srv.Devices[1].GetComputeMode(); m != gonvml.COMPUTEMODE_DEFAULT {
		t.Fatalf("GPU 1 left in compute mode %v", m)
	}
	class := func(uuid string) timeslice.Class {
		t.Helper()
		c, ok := rec.Get(uuid)
		if !ok {
			t.Fatalf("no class set on %s", uuid)
		}
		return c
	}
	a.applyTimeSlices(ctx, t0)
	for _, d := range a.devices {
		if c := class(d.UUID); c != timeslice.Long {
			t.Fatalf("GPU %s: %v, want long (timeSlice.computeBound 100ms, the longer)", d.UUID, c)
		}
	}
	pods = append(pods, pod("serve", "inference", uuid0))
	a.applyTimeSlices(ctx, t0.Add(time.Second))
	if c0, c1 := class(uuid0), class(uuid1); c0 != timeslice.Medium || c1 != timeslice.Long {
		t.Fatalf("with an inference tenant on GPU 0: GPU 0 %v, GPU 1 %v; want medium, long", c0, c1)
	}
	pods = pods[:1]
	a.applyTimeSlices(ctx, t0.Add(2*time.Second))
	if c := class(uuid0); c != timeslice.Long {
		t.Fatalf("after the inference tenant left: GPU 0 %v", c)
	}
	if v := gpuSeries(t, a, "tessera_gpu_timeslice_class", uuid0); v != float64(timeslice.Long) {
		t.Fatalf("tessera_gpu_timeslice_class = %v", v)
	}

	// A driver that refuses: one attempt per GPU, an event, a count, and
	// no second attempt within the minute.
	fail := &failingSlicer{}
	client := newNode()
	b, err := New(Options{Node: "n1", Config: config.Default(), Client: client, NVML: srv, TimeSlicer: fail})
	if err != nil {
		t.Fatal(err)
	}
	b.applyTimeSlices(ctx, t0)
	b.applyTimeSlices(ctx, t0.Add(30*time.Second))
	if fail.calls != 8 {
		t.Fatalf("%d nvidia-smi runs for 8 GPUs in 30 s", fail.calls)
	}
	if v := gpuSeries(t, b, "tessera_gpu_timeslice_failures_total", uuid1); v < 1 {
		t.Fatalf("tessera_gpu_timeslice_failures_total = %v", v)
	}
	// One event per pass, not one per GPU.
	one := func(evs []v1.Event) bool { return len(evs) == 1 && eventWith("TimeSliceNotSet", "n1")(evs) }
	if evs := waitEvents(t, client, metav1.NamespaceDefault, one); !one(evs) {
		t.Fatalf("events: %+v; want one TimeSliceNotSet on node n1", evs)
	}
	b.applyTimeSlices(ctx, t0.Add(time.Minute))
	if fail.calls != 16 {
		t.Fatalf("%d runs after the retry period; want 16", fail.calls)
	}
}

// TestEachAgentExportsItsOwnNode: two agents in one process (as the
// playground runs them) each export only their own node's series, so one
// node's event is counted, and alerted on, once (issue 39: every agent
// re-exported every node's event counters, and one MPS restart fired
// TesseraMPSDaemonRestarts four times).
func TestEachAgentExportsItsOwnNode(t *testing.T) {
	agents := map[string]*Agent{}
	for _, node := range []string{"n1", "n2"} {
		srv := dgxh100.New()
		nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
		a, err := New(Options{Node: node, Config: config.Default(), Client: newNode(), NVML: srv})
		if err != nil {
			t.Fatal(err)
		}
		agents[node] = a
	}
	agents["n1"].m.assignmentChanges.WithLabelValues("n1").Inc()
	for node, a := range agents {
		families, err := a.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, f := range families {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "node" && l.GetValue() != node {
						t.Errorf("agent of %s exports %s{node=%q}", node, f.GetName(), l.GetValue())
					}
				}
				if f.GetName() == "tessera_agent_assignment_changes_total" {
					seen++
					if want := map[string]float64{"n1": 1, "n2": 0}[node]; m.GetCounter().GetValue() != want {
						t.Errorf("agent of %s: assignment changes %v, want %v", node, m.GetCounter().GetValue(), want)
					}
				}
			}
		}
		if seen != 1 {
			t.Errorf("agent of %s exports %d assignment-change series, want its own one", node, seen)
		}
	}
}

// gpuSeries is the value of the agent's series name for GPU uuid, as its
// registry exports it.
func gpuSeries(t *testing.T, a *Agent, name, uuid string) float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "UUID" && l.GetValue() == uuid {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s series for GPU %s", name, uuid)
	return 0
}
