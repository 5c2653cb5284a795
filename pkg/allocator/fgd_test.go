package allocator

import (
	"math"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func milliRequest(cpu int64, count, milli int) *Request {
	r := &Request{CPUMilli: cpu, Sharing: gpu.ModeAuto}
	if count > 0 {
		r.Containers = []Container{{Count: count, Whole: milli == gpu.CoresPerGPU, Cores: milli}}
	}
	return r
}

// fgdExample is a 2-GPU node with 600‰ of GPU 0 in use, and a workload of a
// half-GPU shape (p=.5), a whole-GPU shape (p=.25) and a CPU-only shape (p=.25).
func fgdExample(t *testing.T) (*Node, *Workload, *Allocator) {
	t.Helper()
	w, err := NewWorkload([]ShapeCount{
		{Request: milliRequest(1000, 1, 500), Count: 2},
		{Request: milliRequest(1000, 1, 1000), Count: 1},
		{Request: milliRequest(1000, 0, 0), Count: 1},
	}, 1.0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default().Allocator
	cfg.Policy = config.PolicyFGD
	cfg.MemoryOversubscription = 1.0
	a, err := New(&cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	n := testNode(t, "n", 2, 16000, false)
	var p Placement
	r := milliRequest(0, 1, 600)
	a.Place(n, r, &p)
	n.Apply(r, &p)
	return n, w, a
}

// TestFragmentationByHand checks F_n(M) against the paper's definition worked
// out by hand:
//
//	half-GPU shape: GPU 1 fits, GPU 0 (400‰ free) does not → 400
//	whole-GPU shape: GPU 1 fits → 400
//	CPU-only shape: all free compute → 1400
//	F = .5·400 + .25·400 + .25·1400 = 650
func TestFragmentationByHand(t *testing.T) {
	n, w, a := fgdExample(t)
	if got := w.Fragmentation(n, 1.0); math.Abs(got-650) > 1e-9 {
		t.Fatalf("F = %v, want 650", got)
	}
	// A 300‰ pod: on GPU 0 (→100‰ left) F becomes .5·100+.25·100+.25·1100 = 350;
	// on GPU 1 (→700‰) .5·400+.25·1100+.25·1100 = 750. FGD takes GPU 0.
	var p Placement
	r := milliRequest(0, 1, 300)
	if why := a.Place(n, r, &p); !why.OK() || p.Grants[0].GPU != 0 {
		t.Fatalf("Place() = %v on %+v, want GPU 0", why, p.Grants)
	}
	if want := nodeScore(650 - 350); p.Score != want {
		t.Errorf("score = %v, want nodeScore(300) = %v", p.Score, want)
	}
	n.Apply(r, &p)
	if got := w.Fragmentation(n, 1.0); math.Abs(got-350) > 1e-9 {
		t.Errorf("F after = %v, want 350", got)
	}
}

// TestIncrementalGradientMatchesRecomputation checks the incremental
// F-after used for scoring against F recomputed from scratch on the node with
// the placement applied, for random nodes and requests.
func TestIncrementalGradientMatchesRecomputation(t *testing.T) {
	_, w, _ := fgdExample(t)
	cfg := config.Default().Allocator
	cfg.Policy = config.PolicyFGD
	a, _ := New(&cfg, w)
	n := testNode(t, "n", 8, 16000, false)
	var p Placement
	for i, milli := range []int{600, 250, 1000, 810, 470, 470, 160, 1000, 320, 650} {
		r := milliRequest(int64(500*i), 1, milli)
		var st fragState
		w.prepare(n, a.oversub, &st)
		if !a.place(n, r, &p, &st).OK() {
			t.Fatalf("step %d: does not fit", i)
		}
		var after [MaxGPUsPerNode]usage
		for j := range n.GPUs {
			after[j] = n.GPUs[j].use
		}
		var changed uint64
		for _, g := range p.Grants {
			after[g.GPU] = usage{mem: after[g.GPU].mem + g.MemoryMiB, cores: after[g.GPU].cores + int32(g.Cores), tenants: after[g.GPU].tenants + 1, mode: g.mode}
			changed |= 1 << uint(g.GPU)
		}
		incremental := w.fragAfter(n, &st, &after, changed, n.CPUMilli-n.CPUUsed-r.CPUMilli, n.MemoryMiB-n.MemUsed-r.MemoryMiB, a.oversub)
		n.Apply(r, &p)
		if full := w.Fragmentation(n, a.oversub); math.Abs(full-incremental) > 1e-6 {
			t.Fatalf("step %d: incremental F %v, recomputed %v", i, incremental, full)
		}
	}
}

func TestNewWorkloadCoverage(t *testing.T) {
	var counts []ShapeCount
	for i, c := range []float64{50, 30, 15, 4, 1} {
		counts = append(counts, ShapeCount{Request: milliRequest(int64(i*1000), 1, 100*(i+1)), Count: c})
	}
	w, err := NewWorkload(counts, 0.95)
	if err != nil {
		t.Fatal(err)
	}
	// 50+30+15 = 95 covers 95 %: three shapes, renormalised to 95.
	if w.Len() != 3 {
		t.Fatalf("kept %d shapes, want 3", w.Len())
	}
	var sum float64
	for i := range w.Len() {
		_, p := w.Shape(i)
		sum += p
	}
	if _, p := w.Shape(0); math.Abs(p-50.0/95) > 1e-12 || math.Abs(sum-1) > 1e-12 {
		t.Errorf("weights: first %v, sum %v", p, sum)
	}
	if _, err := NewWorkload(counts, 0); err == nil {
		t.Error("coverage 0 accepted")
	}
}
