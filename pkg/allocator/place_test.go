package allocator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// testNode builds a node of count GPUs of memMiB each; mps marks which are
// MPS-capable.
func testNode(t testing.TB, name string, count int, memMiB int64, mps bool) *Node {
	t.Helper()
	inv := &gpu.NodeInventory{Node: name, CPUMilli: 64000, MemoryMiB: 512 << 10}
	for i := range count {
		inv.GPUs = append(inv.GPUs, gpu.Device{Index: i, UUID: fmt.Sprintf("%s-GPU-%d", name, i), Model: "A100", MemoryMiB: memMiB, Healthy: true, MPSCapable: mps})
	}
	n, err := NewNode(inv)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newAllocator(t testing.TB, policy config.Policy, oversub float64) *Allocator {
	t.Helper()
	cfg := config.Default().Allocator
	cfg.Policy = policy
	cfg.MemoryOversubscription = oversub
	a, err := New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// checked fails the test unless r passes Check, and returns it.
func checked(t testing.TB, r *Request) *Request {
	t.Helper()
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	return r
}

// slice is one container asking for memMiB of one GPU and coresPercent of
// its SMs, sharing auto: as podgpu.Request reads tessera.dev/gpu: 1,
// gpu-memory and gpu-cores.
func slice(memMiB int64, coresPercent int) *Request {
	return &Request{Sharing: gpu.ModeAuto, Containers: []Container{{Name: "main", Count: 1, MemoryMiB: memMiB, Cores: coresPercent * gpu.CoresPerGPU / 100}}}
}

// whole is one container asking for n whole GPUs.
func whole(n int) *Request {
	return &Request{Sharing: gpu.ModeAuto, Containers: []Container{{Name: "main", Count: n, Whole: true}}}
}

// sliceIn is slice in a sharing mode (mps or time-slicing).
func sliceIn(mode gpu.SharingMode, memMiB int64, coresPercent int) *Request {
	r := slice(memMiB, coresPercent)
	r.Sharing = mode
	return r
}

type grantSummary struct {
	GPU   int
	Mem   int64
	Cores int
	Mode  gpu.SharingMode
}

func summarize(p *Placement) []grantSummary {
	var out []grantSummary
	for _, g := range p.Grants {
		out = append(out, grantSummary{g.GPU, g.MemoryMiB, g.Cores, g.Mode()})
	}
	return out
}

func TestPlaceDecisionOrder(t *testing.T) {
	tests := []struct {
		name   string
		mps    bool
		before []*Request // placed first, in order
		req    *Request
		want   []grantSummary
		reason string // substring of the failure, "" = fits
	}{
		{
			name: "no sharing asked gets a whole GPU",
			req:  whole(1),
			want: []grantSummary{{0, 81920, 1000, gpu.ModeExclusive}},
		},
		{
			name: "sharing on an MPS-capable GPU runs as MPS client",
			mps:  true,
			req:  slice(10240, 25),
			want: []grantSummary{{0, 10240, 250, gpu.ModeMPS}},
		},
		{
			name: "sharing elsewhere is time-sliced",
			req:  slice(10240, 25),
			want: []grantSummary{{0, 10240, 250, gpu.ModeTimeSlicing}},
		},
		{
			name:   "mps asked on GPUs without MPS does not fit",
			req:    sliceIn(gpu.ModeMPS, 1024, 10),
			reason: "no MPS-capable GPU",
		},
		{
			// The agent keeps MPS-mode GPUs in exclusive-process compute
			// mode: a second process outside MPS could not open a context.
			name:   "time-slicing asked never goes to an MPS-mode GPU, even a free one",
			mps:    true,
			before: []*Request{slice(1024, 10), slice(1024, 10)},
			req:    sliceIn(gpu.ModeTimeSlicing, 1024, 10),
			reason: "every GPU runs MPS",
		},
		{
			name:   "exclusive annotation takes a whole GPU even with a size",
			req:    &Request{Sharing: gpu.ModeExclusive, Containers: []Container{{Count: 1, Whole: true, MemoryMiB: 1024, Cores: 100}}},
			want:   []grantSummary{{0, 81920, 1000, gpu.ModeExclusive}},
			before: nil,
		},
		{
			name:   "cores are never oversubscribed",
			before: []*Request{slice(1024, 60), slice(1024, 60)},
			req:    slice(1024, 50),
			reason: "no GPU with 1024 MiB and 50% cores free; largest fragment",
		},
		{
			name:   "memory oversubscribed up to 1.5x",
			before: []*Request{slice(61440, 10)},
			req:    slice(61440, 10),
			want:   []grantSummary{{0, 61440, 100, gpu.ModeTimeSlicing}},
		},
		{
			name:   "no memory left at 1.5x",
			before: []*Request{slice(81920, 10), slice(81920, 10), slice(40960, 10), slice(40960, 10)},
			req:    slice(4096, 10),
			reason: "no GPU with 4096 MiB and 10% cores free; largest fragment 0 MiB",
		},
		{
			name: "memory only: cores follow in proportion",
			req:  slice(20480, 0),
			want: []grantSummary{{0, 20480, 250, gpu.ModeTimeSlicing}},
		},
		{
			name: "cores only: memory follows in proportion",
			req:  slice(0, 50),
			want: []grantSummary{{0, 40960, 500, gpu.ModeTimeSlicing}},
		},
		{
			name: "training minimum slice rounds up",
			req:  &Request{Sharing: gpu.ModeAuto, Containers: []Container{{Count: 1, MemoryMiB: 1024, Cores: 100, MinMemoryMiB: config.DefaultMinSliceTrainingMiB}}},
			want: []grantSummary{{0, 8192, 100, gpu.ModeTimeSlicing}},
		},
		{
			name: "inference minimum slice rounds up",
			req:  &Request{Sharing: gpu.ModeAuto, Containers: []Container{{Count: 1, MemoryMiB: 1024, Cores: 100, MinMemoryMiB: config.DefaultMinSliceInferenceMiB}}},
			want: []grantSummary{{0, 4096, 100, gpu.ModeTimeSlicing}},
		},
		{
			name:   "model allow-list",
			req:    &Request{Sharing: gpu.ModeAuto, Models: []string{"H100"}, Containers: []Container{{Count: 1, Whole: true}}},
			reason: "no GPU of an allowed model (H100)",
		},
		{
			name:   "node CPU",
			req:    &Request{Sharing: gpu.ModeAuto, CPUMilli: 65000, Containers: []Container{{Count: 1, Whole: true}}},
			reason: "insufficient CPU: wants 65000m, node has 64000m free",
		},
		{
			name:   "node memory",
			req:    &Request{Sharing: gpu.ModeAuto, MemoryMiB: 1 << 30, Containers: []Container{{Count: 1, Whole: true}}},
			reason: "insufficient memory",
		},
		{
			name:   "whole GPUs must be free",
			before: []*Request{slice(1024, 10), whole(1)},
			req:    whole(1),
			reason: "wants 1 whole GPU, 0 are free",
		},
		{
			name: "two containers never share a GPU",
			req: &Request{Sharing: gpu.ModeAuto, Containers: []Container{
				{Name: "a", Count: 1, MemoryMiB: 1024, Cores: 100},
				{Name: "b", Count: 1, MemoryMiB: 1024, Cores: 100},
			}},
			want: []grantSummary{{0, 1024, 100, gpu.ModeTimeSlicing}, {1, 1024, 100, gpu.ModeTimeSlicing}},
		},
		{
			name: "CPU-only pod takes no GPU",
			req:  &Request{Sharing: gpu.ModeAuto, CPUMilli: 1000, Containers: []Container{{Name: "cpu"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAllocator(t, config.PolicyBinpack, 1.5)
			n := testNode(t, "n", 2, 81920, tt.mps)
			var p Placement
			for i, b := range tt.before {
				r := checked(t, b)
				if why := a.Place(n, r, &p); !why.OK() {
					t.Fatalf("setup request %d: %v", i, why)
				}
				n.Apply(r, &p)
			}
			why := a.Place(n, checked(t, tt.req), &p)
			if tt.reason != "" {
				if why.OK() || !strings.Contains(why.String(), tt.reason) {
					t.Fatalf("Place() = %v, want a failure containing %q", why, tt.reason)
				}
				return
			}
			if !why.OK() {
				t.Fatalf("Place() = %v, want a fit", why)
			}
			if diff := cmp.Diff(tt.want, summarize(&p)); diff != "" {
				t.Errorf("grants (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReasonNamesTheLargestFragment(t *testing.T) {
	a := newAllocator(t, config.PolicyBinpack, 1.0)
	n := testNode(t, "n", 4, 16384, false)
	var p Placement
	for i, mem := range []int64{12288, 16384, 16384, 8192} {
		// Pin each filler to GPU i by placing whole-size slices in order.
		r := checked(t, slice(mem, 10))
		if why := a.Place(n, r, &p); !why.OK() || p.Grants[0].GPU != i {
			t.Fatalf("setup %d: %v on GPU %v", i, why, p.Grants)
		}
		n.Apply(r, &p)
	}
	why := a.Place(n, checked(t, slice(12288, 10)), &p)
	want := "no GPU with 12288 MiB and 10% cores free; largest fragment 8192 MiB and 90% cores on GPU 3"
	if why.String() != want {
		t.Errorf("reason = %q, want %q", why, want)
	}
}

func TestWholeGPUsPreferNVLinkClique(t *testing.T) {
	// GPUs 0-3 and 4-7 form two NVLink islands; GPU 0 is busy, so a 4-GPU
	// request must take 4-7 rather than the lowest free positions 1-4.
	inv := &gpu.NodeInventory{Node: "dgx", CPUMilli: 64000, MemoryMiB: 1 << 20}
	for i := range 8 {
		d := gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Model: "H100", MemoryMiB: 81920, Healthy: true}
		base := i / 4 * 4
		for j := base; j < base+4; j++ {
			if j != i {
				d.NVLinkPeers = append(d.NVLinkPeers, j)
			}
		}
		inv.GPUs = append(inv.GPUs, d)
	}
	n, err := NewNode(inv)
	if err != nil {
		t.Fatal(err)
	}
	a := newAllocator(t, config.PolicyBinpack, 1.0)
	var p Placement
	one := checked(t, whole(1))
	a.Place(n, one, &p)
	n.Apply(one, &p)
	if why := a.Place(n, checked(t, whole(4)), &p); !why.OK() {
		t.Fatal(why)
	}
	var got []int
	for _, g := range p.Grants {
		got = append(got, g.GPU)
	}
	if diff := cmp.Diff([]int{4, 5, 6, 7}, got); diff != "" {
		t.Errorf("GPUs (-want +got):\n%s", diff)
	}
}

func TestUnhealthyGPUIsNotPlacedOn(t *testing.T) {
	a := newAllocator(t, config.PolicyBinpack, 1.0)
	n := testNode(t, "n", 2, 16384, false)
	n.SetHealthy("n-GPU-0", false)
	var p Placement
	if why := a.Place(n, checked(t, slice(1024, 10)), &p); !why.OK() || p.Grants[0].GPU != 1 {
		t.Fatalf("Place() = %v on %v, want GPU 1", why, p.Grants)
	}
	n.SetHealthy("n-GPU-1", false)
	if why := a.Place(n, checked(t, slice(1024, 10)), &p); why.Code != NoHealthyGPU {
		t.Fatalf("Place() = %v, want NoHealthyGPU", why)
	}
}

func TestChooseAndExplain(t *testing.T) {
	a := newAllocator(t, config.PolicyBinpack, 1.0)
	nodes := []*Node{testNode(t, "a", 1, 16384, false), testNode(t, "b", 1, 16384, false)}
	var p Placement
	half := checked(t, slice(8192, 50))
	// Binpack: the second half-GPU pod joins the first on the same node.
	first := a.Choose(nodes, half, &p)
	nodes[first].Apply(half, &p)
	second := a.Choose(nodes, half, &p)
	if first != 0 || second != 0 {
		t.Fatalf("binpack chose %d then %d, want 0 and 0", first, second)
	}
	nodes[second].Apply(half, &p)
	whole2 := checked(t, whole(2))
	if got := a.Choose(nodes, whole2, &p); got != -1 {
		t.Fatalf("Choose() = %d, want -1", got)
	}
	want := "0/2 nodes fit; nodes short of: 2 whole GPUs (at most 1 free on a node)"
	if got := a.Explain(nodes, whole2); got != want {
		t.Errorf("Explain() = %q, want %q", got, want)
	}
}

func TestAddAssignmentRebuildsUsageAndRefusesCorruption(t *testing.T) {
	a := newAllocator(t, config.PolicyBinpack, 1.0)
	n := testNode(t, "n", 2, 16384, true)
	var p Placement
	r := checked(t, slice(4096, 20))
	a.Place(n, r, &p)
	rec := n.Assignment(r, &p)
	// A restarted scheduler rebuilds the node from the recorded assignment.
	m := testNode(t, "n", 2, 16384, true)
	if err := m.AddAssignment(rec, r.CPUMilli, r.MemoryMiB, 1.0); err != nil {
		t.Fatal(err)
	}
	n.Apply(r, &p)
	for i := range n.GPUs {
		if n.GPUs[i].use != m.GPUs[i].use {
			t.Errorf("GPU %d: rebuilt %+v, original %+v", i, m.GPUs[i].use, n.GPUs[i].use)
		}
	}
	bad := *rec
	bad.Containers = []gpu.ContainerAssignment{{Name: "x", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: "n-GPU-0", MemoryMiB: 1, CoresPerMille: 1}}}}
	if err := m.AddAssignment(&bad, 0, 0, 1.0); err == nil || !strings.Contains(err.Error(), "already runs mps") {
		t.Errorf("mode conflict: err = %v", err)
	}
	bad.Containers = []gpu.ContainerAssignment{{Name: "x", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{{UUID: "n-GPU-0", MemoryMiB: 1, CoresPerMille: 900}}}}
	if err := m.AddAssignment(&bad, 0, 0, 1.0); err == nil || !strings.Contains(err.Error(), "over its limits") {
		t.Errorf("over limits: err = %v", err)
	}
	bad.Containers[0].GPUs[0].UUID = "GPU-unknown"
	if err := m.AddAssignment(&bad, 0, 0, 1.0); err == nil || !strings.Contains(err.Error(), "does not have") {
		t.Errorf("unknown GPU: err = %v", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	cfg := config.Default().Allocator
	cfg.Policy = "firstfit"
	if _, err := New(&cfg, nil); err == nil || !strings.Contains(err.Error(), "allocator.policy") {
		t.Errorf("unknown policy: err = %v", err)
	}
	cfg = config.Default().Allocator
	cfg.MemoryOversubscription = 2
	if _, err := New(&cfg, nil); err == nil || !strings.Contains(err.Error(), "allocator.memoryOversubscription") {
		t.Errorf("oversubscription: err = %v", err)
	}
}

// TestSliceCountCapsSharing: a GPU whose agent offers k slices takes k
// sharing tenants and no more (the reason says so); recorded assignments
// beyond a lowered count are
// still accepted, so lowering it never loses a running pod.
func TestSliceCountCapsSharing(t *testing.T) {
	a := newAllocator(t, config.PolicyBinpack, 1.0)
	inv := &gpu.NodeInventory{Node: "n", CPUMilli: 64000, MemoryMiB: 512 << 10, GPUs: []gpu.Device{
		{Index: 0, UUID: "g0", Model: "A100", MemoryMiB: 81920, Healthy: true, Slices: 2},
	}}
	n, err := NewNode(inv)
	if err != nil {
		t.Fatal(err)
	}
	r := checked(t, slice(8192, 10))
	var recorded []*gpu.PodAssignment
	for range 2 {
		var p Placement
		if why := a.Place(n, r, &p); !why.OK() {
			t.Fatalf("slice within the count: %v", why)
		}
		asg := n.Assignment(r, &p)
		if err := n.AddAssignment(asg, r.CPUMilli, r.MemoryMiB, 1.0); err != nil {
			t.Fatal(err)
		}
		recorded = append(recorded, asg)
	}
	var p Placement
	why := a.Place(n, r, &p)
	if why.Code != SlicesFull || !strings.Contains(why.String(), "GPU 0: 2") {
		t.Fatalf("third slice: %v, want SlicesFull naming GPU 0 and its 2 slices", why)
	}
	// The count is lowered to 1 under two running tenants: both stay booked.
	inv.GPUs[0].Slices = 1
	m, err := NewNode(inv)
	if err != nil {
		t.Fatal(err)
	}
	for _, asg := range recorded {
		if err := m.AddAssignment(asg, r.CPUMilli, r.MemoryMiB, 1.0); err != nil {
			t.Fatalf("a running tenant was refused after the count dropped: %v", err)
		}
	}
	if m.GPUs[0].Tenants() != 2 {
		t.Fatalf("%d tenants booked", m.GPUs[0].Tenants())
	}
}

// TestWholeGPUReasonReadsRight: counts agree with their nouns ("1 are
// free" was issue 15's).
func TestWholeGPUReasonReadsRight(t *testing.T) {
	for _, tc := range []struct {
		want, have int64
		text       string
	}{
		{1, 0, "wants 1 whole GPU, 0 are free"},
		{2, 1, "wants 2 whole GPUs, 1 is free"},
		{8, 3, "wants 8 whole GPUs, 3 are free"},
	} {
		if got := (Reason{Code: NotEnoughWholeGPUs, Want: tc.want, Have: tc.have}).String(); got != tc.text {
			t.Errorf("%q, want %q", got, tc.text)
		}
	}
}
