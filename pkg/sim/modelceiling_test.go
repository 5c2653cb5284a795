package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// bestPlacement is the most milli-GPU any placement of pods on nodes can
// allocate, found by trying every placement: each pod unplaced or on one
// node's GPUs (a set of NumGPU of them), within each GPU's 1000, each
// node's CPU and memory, and the pod's models.
func bestPlacement(nodes []NodeSpec, pods []PodSpec) int64 {
	used := make([][]int64, len(nodes))
	for i, n := range nodes {
		used[i] = make([]int64, n.GPUs)
	}
	cpu := make([]int64, len(nodes))
	mem := make([]int64, len(nodes))
	var best int64
	var try func(i int, got int64)
	try = func(i int, got int64) {
		if i == len(pods) {
			best = max(best, got)
			return
		}
		try(i+1, got) // unplaced
		p := pods[i]
		for n, node := range nodes {
			if node.GPUs < p.NumGPU || cpu[n]+p.CPUMilli > node.CPUMilli || mem[n]+p.MemoryMiB > node.MemoryMiB ||
				len(p.Models) > 0 && !slices.Contains(p.Models, node.Model) {
				continue
			}
			// Every set of NumGPU distinct GPUs, as a bitmask.
			for set := 0; set < 1<<node.GPUs; set++ {
				if bitsOf(set) != p.NumGPU {
					continue
				}
				fits := true
				for g := range node.GPUs {
					if set&(1<<g) != 0 && used[n][g]+p.GPUMilli > gpu.CoresPerGPU {
						fits = false
					}
				}
				if !fits {
					continue
				}
				for g := range node.GPUs {
					if set&(1<<g) != 0 {
						used[n][g] += p.GPUMilli
					}
				}
				cpu[n], mem[n] = cpu[n]+p.CPUMilli, mem[n]+p.MemoryMiB
				try(i+1, got+int64(p.NumGPU)*p.GPUMilli)
				cpu[n], mem[n] = cpu[n]-p.CPUMilli, mem[n]-p.MemoryMiB
				for g := range node.GPUs {
					if set&(1<<g) != 0 {
						used[n][g] -= p.GPUMilli
					}
				}
			}
		}
	}
	try(0, 0)
	return best
}

func bitsOf(x int) int {
	n := 0
	for ; x > 0; x &= x - 1 {
		n++
	}
	return n
}

// TestPlacementBoundIsAboveTheOptimum: on 300 small random instances (up
// to three nodes of up to three GPUs of two models, up to six pods of one
// or two GPUs, shares that fragment, CPU and memory that bind, model
// lists), the relaxation is never below the best placement found by trying
// them all, and never above what the pods ask.
func TestPlacementBoundIsAboveTheOptimum(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 0))
	models := []string{"A100", "T4"}
	tight, total := 0, 0
	for i := range 300 {
		var nodes []NodeSpec
		for n := range 1 + r.IntN(3) {
			nodes = append(nodes, NodeSpec{Name: fmt.Sprint("n", n), CPUMilli: int64(2+r.IntN(6)) * 1000, MemoryMiB: int64(4+r.IntN(12)) << 10,
				GPUs: 1 + r.IntN(3), Model: models[r.IntN(2)]})
		}
		var pods []PodSpec
		var asked int64
		for p := range 1 + r.IntN(6) {
			pod := PodSpec{Name: fmt.Sprint("p", p), CPUMilli: int64(1+r.IntN(3)) * 1000, MemoryMiB: int64(1+r.IntN(4)) << 10, NumGPU: 1,
				GPUMilli: []int64{150, 250, 400, 500, 600, 750, 1000}[r.IntN(7)]}
			if r.IntN(4) == 0 {
				pod.NumGPU, pod.GPUMilli = 2, 1000
			}
			if r.IntN(3) == 0 {
				pod.Models = []string{models[r.IntN(2)]}
			}
			pods = append(pods, pod)
			asked += int64(pod.NumGPU) * pod.GPUMilli
		}
		listed := make([]int, len(pods))
		for j := range listed {
			listed[j] = j
		}
		bound, _, _, err := placementBound(nodes, pods, listed)
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		best := bestPlacement(nodes, pods)
		if bound < float64(best) {
			t.Fatalf("instance %d: bound %.1f below the best placement %d\nnodes %+v\npods %+v", i, bound, best, nodes, pods)
		}
		if bound > float64(asked)+2 {
			t.Errorf("instance %d: bound %.1f above the %d asked", i, bound, asked)
		}
		total++
		if bound <= float64(best)+2 {
			tight++
		}
	}
	t.Logf("the bound met the optimum (within 2 milli-GPU) on %d of %d instances", tight, total)
}

// TestModelCeilingIsAboveEveryRun: on the openb default list and the one
// most restricted to GPU models, the model-aware ceiling is never below
// any policy's allocation at 100 % on any of three seeds.
func TestModelCeilingIsAboveEveryRun(t *testing.T) {
	if testing.Short() {
		t.Skip("replays two traces × 4 policies × 3 seeds; skipped in -short")
	}
	for _, wl := range []string{"default", "gpuspec20"} {
		t.Run(wl, func(t *testing.T) {
			tr := openbTrace(t, wl)
			for seed := uint64(42); seed <= 44; seed++ {
				mc, err := tr.ModelCeilingOf(seed, 1.3)
				if err != nil {
					t.Fatal(err)
				}
				old := tr.CeilingOf(seed, 1.3)
				best := 0.0
				for _, pol := range config.Policies {
					r, err := tr.Run(config.Default().Allocator, RunOptions{Policy: pol, Seed: seed, Tune: 1.3})
					if err != nil {
						t.Fatal(err)
					}
					best = max(best, r.At100())
					if r.At100() > mc.At100 {
						t.Errorf("seed %d: %s allocates %.3f%% at 100 %%, above the model-aware ceiling %.3f%%", seed, pol, r.At100(), mc.At100)
					}
				}
				t.Logf("seed %d: best run %.2f%%, model-aware ceiling %.2f%% (%d shapes × %d node types, %v), model-blind %.2f%%",
					seed, best, mc.At100, mc.Shapes, mc.NodeTypes, mc.Took.Round(1e6), old.At100)
			}
		})
	}
}
