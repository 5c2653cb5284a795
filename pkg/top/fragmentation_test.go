package top

import (
	"math"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestMeasureFragmentation: the free GPU compute, and what of it the
// cluster's typical pods cannot use, on one node of two GPUs where GPU 0
// holds a 70 % slice.
func TestMeasureFragmentation(t *testing.T) {
	inv := &gpu.NodeInventory{Node: "n1", CPUMilli: 64000, MemoryMiB: 512 << 10, GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-0", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8},
		{Index: 1, UUID: "GPU-1", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8},
	}}
	placed := map[string][]placedPod{"n1": {{assignment: &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{
		Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: "GPU-0", Index: 0, MemoryMiB: 40960, CoresPerMille: 700}}}}}}}}
	slice := func(mem int64, coresPercent int) *allocator.Request {
		return &allocator.Request{Sharing: gpu.ModeAuto, Containers: []allocator.Container{{Name: "main", Count: 1, MemoryMiB: mem, Cores: coresPercent * 10}}}
	}
	whole := &allocator.Request{Sharing: gpu.ModeAuto, Containers: []allocator.Container{{Name: "main", Count: 1, Whole: true}}}
	for _, tc := range []struct {
		name           string
		requests       []*allocator.Request
		wantFragmented float64
	}{
		// GPU 0's 30 % is too small for a 50 % slice: fragmented; GPU 1 is not.
		{"half-GPU slices", []*allocator.Request{slice(20480, 50), slice(20480, 50)}, 0.3},
		// A 20 % slice fits both: nothing is fragmented.
		{"small slices", []*allocator.Request{slice(8192, 20)}, 0},
		// Whole GPUs: GPU 0's remainder is lost to them.
		{"whole GPUs", []*allocator.Request{whole}, 0.3},
		// Half the pods want a whole GPU, half a 20 % slice: F = ½·0.3 + ½·0.
		{"a mix", []*allocator.Request{whole, slice(8192, 20)}, 0.15},
		// No GPU pod seen: no workload to measure against.
		{"no pods", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := measureFragmentation([]*gpu.NodeInventory{inv}, placed, tc.requests)
			if math.Abs(f.FreeGPUs-1.3) > 1e-9 {
				t.Errorf("free %v GPUs, want 1.3", f.FreeGPUs)
			}
			if math.Abs(f.FragmentedGPUs-tc.wantFragmented) > 1e-9 {
				t.Errorf("fragmented %v GPUs, want %v", f.FragmentedGPUs, tc.wantFragmented)
			}
		})
	}
}
