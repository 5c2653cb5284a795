package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/agent/nvml"
	"github.com/tessera-gpu/tessera/pkg/agent/nvml/nvmltest"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
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
	if inv := published(t, client); len(inv.GPUs) != 0 {
		t.Fatalf("an empty node published %d GPUs", len(inv.GPUs))
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
	evs, err := client.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(evs.Items) != 1 || evs.Items[0].Reason != "ForecastAboveThreshold" || evs.Items[0].Regarding.Name != "n1" {
		t.Fatalf("events %+v, %v; want one ForecastAboveThreshold on node n1", evs, err)
	}
	inv := published(t, client)
	if inv.GPUs[0].Slices != cfg.Fragments.MaxSlices-1 || inv.GPUs[1].Slices != cfg.Fragments.MaxSlices {
		t.Fatalf("published slices %d and %d", inv.GPUs[0].Slices, inv.GPUs[1].Slices)
	}
}
