package sim

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

func syntheticTrace(t testing.TB, nodes, pods int) *Trace {
	t.Helper()
	n, p := Synthetic(SyntheticOptions{Nodes: nodes, Pods: pods, Seed: 7})
	tr, err := NewTrace("synthetic", n, p, config.DefaultWorkloadCoverage)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestArrivals(t *testing.T) {
	tr := syntheticTrace(t, 32, 300)
	capacity := int64(tr.GPUs()) * 1000
	for _, tune := range []float64{0.5, 1.0, 1.3, 2.0} {
		seq := tr.Arrivals(42, tune)
		if diff := cmp.Diff(seq, tr.Arrivals(42, tune)); diff != "" {
			t.Fatalf("tune %v: arrivals differ for the same seed", tune)
		}
		var demand int64
		counts := map[int]int{}
		for _, i := range seq {
			demand += tr.Pods[i].Demand()
			counts[i]++
		}
		target := int64(tune * float64(capacity))
		var listDemand int64
		for _, p := range tr.Pods {
			listDemand += p.Demand()
		}
		if listDemand <= target {
			// Every pod of the list arrives, and the draws stop at the target.
			for i := range tr.Pods {
				if counts[i] == 0 {
					t.Fatalf("tune %v: pod %d of the list never arrives", tune, i)
				}
			}
			if demand < target {
				t.Errorf("tune %v: demand %d below target %d", tune, demand, target)
			}
		} else if demand > target {
			t.Errorf("tune %v: removal stopped above the target: %d > %d", tune, demand, target)
		}
	}
	if cmp.Equal(tr.Arrivals(42, 1.3), tr.Arrivals(43, 1.3)) {
		t.Error("seeds 42 and 43 give the same arrivals")
	}
}

// TestCacheMakesThePlainPlacements replays traces with and without the
// per-node cache and requires the same node for every arrival.
func TestCacheMakesThePlainPlacements(t *testing.T) {
	tr := syntheticTrace(t, 48, 800)
	cfg := config.Default().Allocator
	for _, pol := range config.Policies {
		for _, seed := range []uint64{42, 43} {
			cached, err := tr.Run(cfg, RunOptions{Policy: pol, Seed: seed, Tune: 1.3, KeepPlacements: true})
			if err != nil {
				t.Fatal(err)
			}
			plain, err := tr.Run(cfg, RunOptions{Policy: pol, Seed: seed, Tune: 1.3, KeepPlacements: true, Plain: true})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(plain.Placed, cached.Placed); diff != "" {
				t.Fatalf("%s seed %d: cached placements differ (-plain +cached):\n%s", pol, seed, diff)
			}
			if placed := len(cached.Placed) - cached.Failed; placed < len(cached.Placed)/2 {
				t.Fatalf("%s seed %d: only %d of %d placed; the comparison proves little", pol, seed, placed, len(cached.Placed))
			}
		}
	}
}

func TestCurveAndCSV(t *testing.T) {
	tr := syntheticTrace(t, 16, 200)
	res, err := tr.Run(config.Default().Allocator, RunOptions{Policy: config.PolicyTessera, Seed: 1, Tune: 1.3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Curve) != 131 {
		t.Fatalf("curve has %d columns, want 131 (0..130)", len(res.Curve))
	}
	// The one fragmentation figure at the end: its free compute is what
	// the run left unallocated, and its fragmented part lies within it.
	f := res.Fragmentation
	if free := (1 - res.Final/100) * float64(res.GPUs); math.Abs(f.FreeGPUs-free) > 1e-6 {
		t.Errorf("fragmentation's free GPUs %v, the run left %v unallocated", f.FreeGPUs, free)
	}
	if f.FragmentedGPUs < 0 || f.FragmentedGPUs > f.FreeGPUs+1e-9 || f.Shapes == 0 {
		t.Errorf("fragmentation %+v", f)
	}
	for k := 1; k <= 130; k++ {
		v := res.Curve[k]
		if math.IsNaN(v) {
			t.Fatalf("column %d is empty", k)
		}
		// Allocation never exceeds arrived demand (+ half a column of rounding) nor 100 %.
		if v > float64(k)+0.5+1e-9 || v > 100 {
			t.Fatalf("column %d: allocation %.2f%%", k, v)
		}
	}
	var buf bytes.Buffer
	if err := WriteCSV(&buf, []*Result{res}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "workload,sc_policy,tune,seed,total_gpus,0,1,2,") || !strings.HasSuffix(lines[0], ",129,130") {
		t.Fatalf("CSV header: %q", lines[0])
	}
	if !strings.HasPrefix(lines[1], "synthetic,tessera,1.3,1,") {
		t.Errorf("CSV row: %q", lines[1][:40])
	}
	if got := strings.Count(lines[1], ","); got != 135 {
		t.Errorf("row has %d commas, want 135", got)
	}
}

// The published numbers (FGD paper's simulator, mean of seeds 42–51, tune 1.3;
// ../shared/traces/openb/README.md).
var published = map[string]struct{ fgd, bestFit float64 }{
	"default":    {95.23, 92.86},
	"gpushare40": {93.96, 91.44},
	"multigpu50": {97.09, 95.62},
	"gpuspec10":  {94.66, 93.10},
}

// TestOpenbReproducesPublishedFGD replays the openb traces with seeds 42–51 and
// checks that fgd lands within ±0.5 points of the published FGD, binpack near
// the published BestFit, and tessera no worse than fgd.
func TestOpenbReproducesPublishedFGD(t *testing.T) {
	if testing.Short() {
		t.Skip("replays four traces × 3 policies × 10 seeds; skipped in -short")
	}
	for _, wl := range []string{"default", "gpushare40", "multigpu50", "gpuspec10"} {
		t.Run(wl, func(t *testing.T) {
			tr := openbTrace(t, wl)
			mean := map[config.Policy]float64{}
			for _, pol := range []config.Policy{config.PolicyFGD, config.PolicyBinpack, config.PolicyTessera} {
				for seed := uint64(42); seed <= 51; seed++ {
					r, err := tr.Run(config.Default().Allocator, RunOptions{Policy: pol, Seed: seed, Tune: 1.3})
					if err != nil {
						t.Fatal(err)
					}
					mean[pol] += r.At100() / 10
				}
			}
			want := published[wl]
			t.Logf("%s: fgd %.2f%% (published %.2f), binpack %.2f%% (BestFit %.2f), tessera %.2f%%", wl, mean["fgd"], want.fgd, mean["binpack"], want.bestFit, mean["tessera"])
			if math.Abs(mean["fgd"]-want.fgd) > 0.5 {
				t.Errorf("fgd %.2f%%, published %.2f%%: more than 0.5 points apart", mean["fgd"], want.fgd)
			}
			if math.Abs(mean["binpack"]-want.bestFit) > 1.0 {
				t.Errorf("binpack %.2f%%, published BestFit %.2f%%: more than 1 point apart", mean["binpack"], want.bestFit)
			}
			if mean["tessera"] < mean["fgd"] {
				t.Errorf("tessera %.2f%% below fgd %.2f%%", mean["tessera"], mean["fgd"])
			}
		})
	}
}

func TestCacheOnOpenbDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("a plain replay of the default trace takes several seconds; skipped in -short")
	}
	tr := openbTrace(t, "default")
	cfg := config.Default().Allocator
	cached, _ := tr.Run(cfg, RunOptions{Policy: config.PolicyTessera, Seed: 42, Tune: 1.3, KeepPlacements: true})
	plain, _ := tr.Run(cfg, RunOptions{Policy: config.PolicyTessera, Seed: 42, Tune: 1.3, KeepPlacements: true, Plain: true})
	if diff := cmp.Diff(plain.Placed, cached.Placed); diff != "" {
		t.Fatalf("cached placements differ on openb default (-plain +cached):\n%s", diff)
	}
}

func TestParseSeeds(t *testing.T) {
	for in, want := range map[string][]uint64{"42-45": {42, 43, 44, 45}, "1,3": {1, 3}, "7": {7}, "1-2,9": {1, 2, 9}} {
		got, err := ParseSeeds(in)
		if err != nil || !cmp.Equal(got, want) {
			t.Errorf("ParseSeeds(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "5-3", "1-", "-1", "0-20000", "4.5"} {
		if _, err := ParseSeeds(bad); err == nil {
			t.Errorf("ParseSeeds(%q) accepted", bad)
		}
	}
	// A range written backwards says so, and how to write it (issue 39:
	// "9-3 is not a range").
	if _, err := ParseSeeds("9-3"); err == nil || !strings.Contains(err.Error(), `range "9-3" runs backwards; write it low-high, as 3-9`) {
		t.Errorf("ParseSeeds(9-3): %v", err)
	}
}
