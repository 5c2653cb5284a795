package allocator

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestMemoryHardPlacesOnlyWhereTheKernelHoldsMemory: a pod asking for
// tessera.dev/isolation=memory-hard gets slices only on time-sliced GPUs
// whose driver offers NVML cgroup limits, whole GPUs anywhere, and a reason
// naming the floor otherwise.
func TestMemoryHardPlacesOnlyWhereTheKernelHoldsMemory(t *testing.T) {
	kernel := &gpu.IsolationOffer{KernelMemoryLimits: true}
	mpsAndKernel := &gpu.IsolationOffer{KernelMemoryLimits: true, MPSLimits: true}
	hard := func(r *Request) *Request { r.MemoryHard = true; return r }
	tests := []struct {
		name   string
		gpus   []gpu.Device // Index, UUID, memory filled in
		req    *Request
		want   []grantSummary
		reason string
	}{
		{
			name: "slice lands on the GPU that offers kernel limits",
			gpus: []gpu.Device{{}, {Isolation: kernel}},
			req:  hard(slice(8192, 20)),
			want: []grantSummary{{1, 8192, 200, gpu.ModeTimeSlicing}},
		},
		{
			name: "without the floor the first GPU takes it",
			gpus: []gpu.Device{{}, {Isolation: kernel}},
			req:  slice(8192, 20),
			want: []grantSummary{{0, 8192, 200, gpu.ModeTimeSlicing}},
		},
		{
			name:   "no GPU offers kernel limits",
			gpus:   []gpu.Device{{}, {}},
			req:    hard(slice(8192, 20)),
			reason: "tessera.dev/isolation=memory-hard",
		},
		{
			name:   "MPS GPUs do not count even with kernel limits",
			gpus:   []gpu.Device{{MPSCapable: true, Isolation: mpsAndKernel}},
			req:    hard(slice(8192, 20)),
			reason: "no GPU here holds a slice's memory in the kernel",
		},
		{
			name: "whole GPUs qualify anywhere",
			gpus: []gpu.Device{{}, {}},
			req:  hard(whole(1)),
			want: []grantSummary{{0, 81920, 1000, gpu.ModeExclusive}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := &gpu.NodeInventory{Node: "n", CPUMilli: 64000, MemoryMiB: 512 << 10}
			for i, d := range tt.gpus {
				d.Index, d.UUID, d.Model, d.MemoryMiB, d.Healthy = i, "GPU-"+string(rune('a'+i)), "H200", 81920, true
				inv.GPUs = append(inv.GPUs, d)
			}
			n, err := NewNode(inv)
			if err != nil {
				t.Fatal(err)
			}
			a := newAllocator(t, config.PolicyBinpack, 1.0)
			var p Placement
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

func TestMemoryHardKeysApart(t *testing.T) {
	hardSlice := func() *Request { r := slice(8192, 20); r.MemoryHard = true; return r }
	a, b := checked(t, slice(8192, 20)), checked(t, hardSlice())
	if a.Key() == b.Key() {
		t.Fatalf("a memory-hard request shares its key with a plain one: %s", a.Key())
	}
}
