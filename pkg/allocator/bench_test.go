package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// benchWorkload is shaped like the openb default trace's target workload: 35
// shapes, mostly whole GPUs and a spread of fractions, some CPU-only.
func benchWorkload(b *testing.B) *Workload {
	rng := rand.New(rand.NewPCG(1, 1))
	milli := []int{1000, 1000, 1000, 810, 470, 650, 320, 460, 230, 160, 0}
	var counts []ShapeCount
	for range 35 {
		m := milli[rng.IntN(len(milli))]
		r := milliRequest(int64(1000*(1+rng.IntN(16))), 1, m)
		if m == 0 {
			r = milliRequest(int64(1000*(1+rng.IntN(16))), 0, 0)
		}
		counts = append(counts, ShapeCount{Request: r, Count: float64(1 + rng.IntN(100))})
	}
	w, err := NewWorkload(counts, 1.0)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// BenchmarkPlace is Filter+Score of one pod on one 8-GPU node with half of its
// GPUs shared: what the scheduler plugin pays per node per pod.
func BenchmarkPlace(b *testing.B) {
	for _, policy := range config.Policies {
		for _, kind := range []string{"slice", "whole"} {
			b.Run(string(policy)+"/"+kind, func(b *testing.B) {
				cfg := config.Default().Allocator
				cfg.Policy = policy
				a, err := New(&cfg, benchWorkload(b))
				if err != nil {
					b.Fatal(err)
				}
				n := testNode(b, "n", 8, 81920, true)
				var p Placement
				for _, m := range []int{470, 320, 810, 230} {
					r := milliRequest(4000, 1, m)
					a.Place(n, r, &p)
					n.Apply(r, &p)
				}
				r := milliRequest(4000, 1, 460)
				if kind == "whole" {
					r = milliRequest(8000, 1, gpu.CoresPerGPU)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if !a.Place(n, r, &p).OK() {
						b.Fatal("does not fit")
					}
				}
			})
		}
	}
}
