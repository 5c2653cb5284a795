package sim

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

// openbTrace loads an openb workload from ../shared, skipping when the traces
// are not beside the repository (CI has them).
func openbTrace(tb testing.TB, workload string) *Trace {
	tb.Helper()
	dir := filepath.Join("..", "..", "..", "shared", "traces", "openb")
	nodes, err := ReadNodes(filepath.Join(dir, "openb_node_list_gpu_node.csv"))
	if os.IsNotExist(err) {
		tb.Skipf("needs the openb traces in %s (../shared beside the repository, as in CI)", dir)
	}
	if err != nil {
		tb.Fatal(err)
	}
	pods, err := ReadPods(filepath.Join(dir, "openb_pod_list_"+workload+".csv"))
	if err != nil {
		tb.Fatal(err)
	}
	tr, err := NewTrace(workload, nodes, pods, config.DefaultWorkloadCoverage)
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

// BenchmarkPlaceOpenb is Filter+Score of one openb pod on one 8-GPU G2 node
// carrying a typical mix, against the trace's real target workload.
func BenchmarkPlaceOpenb(b *testing.B) {
	tr := openbTrace(b, "default")
	for _, pol := range config.Policies {
		for _, kind := range []struct {
			name  string
			milli int64
		}{{"slice", 470}, {"whole", 1000}} {
			b.Run(string(pol)+"/"+kind.name, func(b *testing.B) {
				cfg := config.Default().Allocator
				cfg.Policy = pol
				cfg.MemoryOversubscription = 1
				a, err := allocator.New(&cfg, tr.Workload())
				if err != nil {
					b.Fatal(err)
				}
				n, err := allocator.NewNode(NodeSpec{Name: "g2", CPUMilli: 96000, MemoryMiB: 393216, GPUs: 8, Model: "G2"}.Inventory())
				if err != nil {
					b.Fatal(err)
				}
				var p allocator.Placement
				for _, m := range []int64{810, 470, 650, 320} {
					r := PodSpec{CPUMilli: 6000, MemoryMiB: 12288, NumGPU: 1, GPUMilli: m}.Request()
					a.Place(n, r, &p)
					n.Apply(r, &p)
				}
				r := PodSpec{CPUMilli: 6000, MemoryMiB: 12288, NumGPU: 1, GPUMilli: kind.milli}.Request()
				b.ReportAllocs()
				for b.Loop() {
					if !a.Place(n, r, &p).OK() {
						b.Fatal("does not fit")
					}
				}
			})
		}
	}
}

// BenchmarkReplayOpenb replays the default trace once (seed 42, tune 1.3),
// with the per-node cache and without it.
func BenchmarkReplayOpenb(b *testing.B) {
	tr := openbTrace(b, "default")
	for _, pol := range []config.Policy{config.PolicyFGD, config.PolicyTessera} {
		for _, plain := range []bool{false, true} {
			name := string(pol) + "/cached"
			if plain {
				name = string(pol) + "/plain"
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					if _, err := tr.Run(config.Default().Allocator, RunOptions{Policy: pol, Seed: 42, Tune: 1.3, Plain: plain}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
