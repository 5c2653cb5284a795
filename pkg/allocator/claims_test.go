package allocator

import (
	"slices"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func TestRankOrdersGPUsByThePolicy(t *testing.T) {
	n := testNode(t, "n", 4, 81920, true)
	n.DRA = true // claims are what a DRA node serves: Rank places them there
	if !n.Occupy("n-GPU-2", 40960, 500, gpu.ModeMPS) || !n.Occupy("n-GPU-3", 81920, 1000, gpu.ModeExclusive) {
		t.Fatal("Occupy: the node's GPU not found")
	}
	if n.Occupy("elsewhere", 1, 1, gpu.ModeMPS) {
		t.Error("Occupy of a GPU the node does not have reported it found")
	}
	before := n.Version
	for _, tc := range []struct {
		name   string
		policy config.Policy
		req    *Request
		want   []int
		fits   bool
	}{
		// Binpack fills the partly used GPU 2 first; GPU 3 is full and
		// comes last, where the structured allocator finds no room either.
		{"binpack slice", config.PolicyBinpack, slice(10240, 25), []int{2, 0, 1, 3}, true},
		// Spread takes an empty GPU first, the partly used one after both.
		{"spread slice", config.PolicySpread, slice(10240, 25), []int{0, 1, 2, 3}, true},
		// A whole GPU fits only the empty ones.
		{"whole", config.PolicyBinpack, whole(1), []int{0, 1, 2, 3}, true},
		// More than GPU 2 has left, and more than a GPU has: nothing fits,
		// the order is the node's.
		{"too large", config.PolicyBinpack, slice(90000, 25), []int{0, 1, 2, 3}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order, _, ok := newAllocator(t, tc.policy, 1).Rank(n, checked(t, tc.req))
			if !slices.Equal(order, tc.want) || ok != tc.fits {
				t.Errorf("Rank = %v (fits %v), want %v (fits %v)", order, ok, tc.want, tc.fits)
			}
		})
	}
	if n.Version != before || !n.GPUs[0].Healthy {
		t.Error("Rank changed the node it ranked")
	}
}
