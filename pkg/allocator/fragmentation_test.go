package allocator

import (
	"math"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestMeasureFragmentation is the user guide's worked example: one node of
// two H100s, GPU 0 holding a 70 % slice, so 1.3 GPUs are free. Against pods
// half of which want a whole GPU and half a 20 % slice, GPU 0's 0.3 is lost
// to the whole-GPU half: F = ½·0.3 + ½·0 = 0.15 GPUs, 11.5 % of the free.
func TestMeasureFragmentation(t *testing.T) {
	n, err := NewNode(&gpu.NodeInventory{Node: "n1", CPUMilli: 64000, MemoryMiB: 512 << 10, GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-0", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8},
		{Index: 1, UUID: "GPU-1", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.AddAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeTimeSlicing,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 40960, CoresPerMille: 700}}}}}, 0, 0, 1.5); err != nil {
		t.Fatal(err)
	}
	whole := &Request{Sharing: gpu.ModeAuto, Containers: []Container{{Name: "main", Count: 1, Whole: true}}}
	slice := &Request{Sharing: gpu.ModeAuto, Containers: []Container{{Name: "main", Count: 1, MemoryMiB: 8192, Cores: 200}}}
	for _, tc := range []struct {
		name           string
		present        []*Request
		wantFragmented float64
	}{
		{"a mix", []*Request{whole, slice}, 0.15},
		{"whole GPUs only", []*Request{whole, whole}, 0.3},
		{"small slices only", []*Request{slice}, 0},
		{"no GPU pod present", nil, 0},
	} {
		f := MeasureFragmentation([]*Node{n}, PresentWorkload(tc.present, 0.95), 1.5)
		if math.Abs(f.FreeGPUs-1.3) > 1e-9 || math.Abs(f.FragmentedGPUs-tc.wantFragmented) > 1e-9 {
			t.Errorf("%s: %+v, want 1.3 free, %v fragmented", tc.name, f, tc.wantFragmented)
		}
	}
	if r := MeasureFragmentation([]*Node{n}, PresentWorkload([]*Request{whole, slice}, 0.95), 1.5).Ratio(); math.Abs(r-0.15/1.3) > 1e-9 {
		t.Errorf("ratio %v, want 0.15/1.3", r)
	}
}

// TestSliceCapCountsInTheGradient: a GPU whose agent's slice count is
// reached takes no more slices, so its free compute is fragment in the
// one fragmentation, and the FGD and tessera scores prefer the node whose
// GPU keeps room for the next slice (issue 43: the scores, not only the
// fit, honour the cap).
func TestSliceCapCountsInTheGradient(t *testing.T) {
	node := func(name string, slices int) *Node {
		t.Helper()
		n, err := NewNode(&gpu.NodeInventory{Node: name, CPUMilli: 64000, MemoryMiB: 512 << 10, GPUs: []gpu.Device{
			{Index: 0, UUID: "GPU-" + name, Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: slices}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.AddAssignment(&gpu.PodAssignment{Node: name, Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeTimeSlicing,
			GPUs: []gpu.GPUGrant{{UUID: "GPU-" + name, MemoryMiB: 20480, CoresPerMille: 500}}}}}, 0, 0, 1); err != nil {
			t.Fatal(err)
		}
		return n
	}
	quarter := &Request{Sharing: gpu.ModeTimeSlicing, Containers: []Container{{Name: "main", Count: 1, MemoryMiB: 8192, Cores: 250}}}
	w := PresentWorkload([]*Request{quarter}, 1)
	// One tenant on a GPU of one slice: its free half is lost.
	if f := NodeFragmentation(node("capped", 1), w, 1); math.Abs(f.FreeGPUs-0.5) > 1e-9 || math.Abs(f.FragmentedGPUs-0.5) > 1e-9 {
		t.Errorf("a full GPU's free compute: %+v, want 0.5 free, all of it fragmented", f)
	}
	if f := NodeFragmentation(node("roomy", 8), w, 1); f.FragmentedGPUs != 0 {
		t.Errorf("a GPU with slices to spare: %+v, want nothing fragmented", f)
	}
	// A quarter on "tight" (2 slices, one taken) fills its count and
	// strands its last quarter; on "roomy" it does not.
	for _, policy := range []config.Policy{config.PolicyFGD, config.PolicyTessera} {
		cfg := config.Default().Allocator
		cfg.Policy, cfg.MemoryOversubscription = policy, 1
		a, err := New(&cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		var onTight, onRoomy Placement
		if r := a.Place(node("tight", 2), quarter, &onTight); !r.OK() {
			t.Fatalf("%s: a quarter does not fit the tight node: %v", policy, r)
		}
		if r := a.Place(node("roomy", 8), quarter, &onRoomy); !r.OK() {
			t.Fatalf("%s: a quarter does not fit the roomy node: %v", policy, r)
		}
		if onTight.Score >= onRoomy.Score {
			t.Errorf("%s: the tight node scores %v, the roomy one %v; want the roomy one higher", policy, onTight.Score, onRoomy.Score)
		}
	}
}
