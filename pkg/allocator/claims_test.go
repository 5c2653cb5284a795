package allocator

import (
	"fmt"
	"math/rand/v2"
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

// TestRankSliceAgreesWithPlace: on random loaded nodes, under every policy
// with a workload, a slice's ranking starts where Place puts it, with
// Place's score; lists every GPU once; and puts the GPUs the slice fits
// (Place with that GPU alone available) before those it does not.
func TestRankSliceAgreesWithPlace(t *testing.T) {
	for _, policy := range config.Policies {
		t.Run(string(policy), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(policy))))
			cfg := config.Default().Allocator
			cfg.Policy = policy
			var counts []ShapeCount
			for range 8 {
				counts = append(counts, ShapeCount{Request: checked(t, randomRequest(rng)), Count: float64(1 + rng.IntN(20))})
			}
			w, err := NewWorkload(counts, 0.95)
			if err != nil {
				t.Fatal(err)
			}
			a, err := New(&cfg, w)
			if err != nil {
				t.Fatal(err)
			}
			for round := range 300 {
				n, err := NewNode(randomInventory(rng, fmt.Sprintf("n%d", round)))
				if err != nil {
					t.Fatal(err)
				}
				for range rng.IntN(6) {
					var p Placement
					if r := checked(t, randomRequest(rng)); a.Place(n, r, &p).OK() {
						n.Apply(r, &p)
					}
				}
				sharing := []gpu.SharingMode{gpu.ModeAuto, gpu.ModeMPS, gpu.ModeTimeSlicing}[rng.IntN(3)]
				r := checked(t, &Request{Sharing: sharing, Containers: []Container{{Name: "claim", Count: 1,
					MemoryMiB: 1024 * rng.Int64N(40), Cores: (1 + rng.IntN(100)) * gpu.CoresPerGPU / 100}}})
				order, score, ok := a.Rank(n, r)
				var p Placement
				placed := a.Place(n, r, &p).OK()
				if ok != placed || ok && (order[0] != p.Grants[0].GPU || score != p.Score) {
					t.Fatalf("round %d: Rank %v (score %v, fits %v); Place %+v (fits %v)", round, order, score, ok, p, placed)
				}
				seen := map[int]bool{}
				fitting := true
				for _, i := range order {
					if seen[i] {
						t.Fatalf("round %d: GPU %d ranked twice: %v", round, i, order)
					}
					seen[i] = true
					alone := n.Clone()
					for j := range alone.GPUs {
						alone.GPUs[j].Healthy = alone.GPUs[j].Healthy && j == i
					}
					fits := a.Place(alone, r, &p).OK()
					if fits && !fitting {
						t.Fatalf("round %d: GPU %d fits but is ranked after one that does not: %v", round, i, order)
					}
					fitting = fitting && fits
				}
				if len(seen) != len(n.GPUs) {
					t.Fatalf("round %d: ranked %v of %d GPUs", round, order, len(n.GPUs))
				}
			}
		})
	}
}
