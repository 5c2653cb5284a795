package sim

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func countsOf(items ...int) *[gpu.CoresPerGPU]int {
	var c [gpu.CoresPerGPU]int
	for _, s := range items {
		c[s]++
	}
	return &c
}

func repeat(n, s int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestBinsLowerBound(t *testing.T) {
	for _, tc := range []struct {
		name     string
		items    []int
		want, lp int
	}{
		{"none", nil, 0, 0},
		{"halves pair up", repeat(4, 500), 2, 2},
		{"600s and 400s pair up", append(repeat(3, 600), repeat(3, 400)...), 3, 3},
		// 450 cannot join 600: three bins of 600, two of 450 pairs.
		{"600s and 450s cannot", append(repeat(3, 600), repeat(3, 450)...), 5, 5},
		// 810s leave 190 slivers no 300 fits: L2 10 + ⌈3000/1000⌉; the
		// relaxation also sees that 300s go three to a GPU: 10 + ⌈10/3⌉.
		{"810 slivers", append(repeat(10, 810), repeat(10, 300)...), 13, 14},
		// A 190 fits an 810's sliver exactly.
		{"810 and 190", append(repeat(5, 810), repeat(5, 190)...), 5, 5},
	} {
		if got := binsLowerBound(countsOf(tc.items...)); got != tc.want {
			t.Errorf("%s: L2 %d bins, want %d", tc.name, got, tc.want)
		}
		if got := lpBinsLowerBound(countsOf(tc.items...)); got != tc.lp {
			t.Errorf("%s: LP %d bins, want %d", tc.name, got, tc.lp)
		}
	}
	// Where L2 is weak: 470s pair, 320s go three to a GPU; L2 sees only
	// the total (⌈(30×470 + 30×320)/1000⌉ = 24), the relaxation 25.
	items := append(repeat(30, 470), repeat(30, 320)...)
	if l2, gg := binsLowerBound(countsOf(items...)), lpBinsLowerBound(countsOf(items...)); l2 != 24 || gg != 25 {
		t.Errorf("470s and 320s: L2 %d, LP %d; want 24 and 25", l2, gg)
	}
}

// optimalBins is the exact bin count by trying every order with first fit
// (first fit over some order reaches the optimum): small inputs only.
func optimalBins(items []int) int {
	best := len(items)
	var permute func(k int)
	permute = func(k int) {
		if k == len(items) {
			var bins []int
			for _, s := range items {
				placed := false
				for i := range bins {
					if bins[i]+s <= gpu.CoresPerGPU {
						bins[i] += s
						placed = true
						break
					}
				}
				if !placed {
					bins = append(bins, s)
				}
			}
			best = min(best, len(bins))
			return
		}
		for i := k; i < len(items); i++ {
			items[k], items[i] = items[i], items[k]
			permute(k + 1)
			items[k], items[i] = items[i], items[k]
		}
	}
	permute(0)
	return best
}

// TestBinsLowerBoundNeverAboveOptimum: on random small inputs the bound is
// never above the exact optimum and never below the total's ceiling.
func TestBinsLowerBoundNeverAboveOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{100, 150, 190, 200, 250, 300, 333, 450, 500, 510, 600, 750, 810, 900}
	tight := 0
	for range 400 {
		items := make([]int, 1+rng.IntN(7))
		total := 0
		for i := range items {
			items[i] = sizes[rng.IntN(len(sizes))]
			total += items[i]
		}
		l2, gg, opt := binsLowerBound(countsOf(items...)), lpBinsLowerBound(countsOf(items...)), optimalBins(items)
		if l2 > opt || l2 < (total+999)/1000 || gg > opt || gg < (total+999)/1000 {
			t.Fatalf("%v: L2 %d, LP %d, optimum %d, total %d", items, l2, gg, opt, total)
		}
		if max(l2, gg) == opt {
			tight++
		}
	}
	t.Logf("bound equal to the optimum on %d of 400 inputs", tight)
}

// TestRunsStayUnderTheCeiling: every policy's allocation at 100 % stays
// under the seed's ceiling whenever it placed every sharing pod by then.
func TestRunsStayUnderTheCeiling(t *testing.T) {
	tr := syntheticTrace(t, 48, 600)
	checked := 0
	for seed := uint64(1); seed <= 4; seed++ {
		c := tr.CeilingOf(seed, 1.3)
		if math.IsNaN(c.At100) || c.SharingPods == 0 || c.SliverGPUs < 0 {
			t.Fatalf("seed %d: ceiling %+v", seed, c)
		}
		for _, pol := range config.Policies {
			r, err := tr.Run(config.Default().Allocator, RunOptions{Policy: pol, Seed: seed, Tune: 1.3})
			if err != nil {
				t.Fatal(err)
			}
			if r.SharingFailedBy100 > 0 {
				continue
			}
			checked++
			if r.At100() > c.At100+1e-9 {
				t.Errorf("seed %d %s: %.3f%% at 100 %%, above the ceiling %.3f%%", seed, pol, r.At100(), c.At100)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no run placed all its sharing pods: the ceiling was never checked")
	}
}
