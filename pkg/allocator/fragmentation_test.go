package allocator

import (
	"math"
	"testing"

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
