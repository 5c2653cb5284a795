package sim

import (
	"fmt"
	"math/rand/v2"
)

// SyntheticOptions size the built-in workload.
type SyntheticOptions struct {
	// Nodes is the number of GPU nodes (default 128).
	Nodes int
	// Pods is the number of pods in the list before tuning (default 2000).
	Pods int
	// Seed drives the generator; the same seed gives the same trace.
	Seed uint64
}

type nodeKind struct {
	weight   int
	cpuMilli int64
	memMiB   int64
	gpus     int
	model    string
}

// The node mix: a modern training pool (H100, A100), an inference pool (T4,
// A10) and older hosts with little CPU per GPU, the shape that strands GPUs.
var syntheticNodes = []nodeKind{
	{weight: 3, cpuMilli: 128000, memMiB: 1 << 20, gpus: 8, model: "H100"},
	{weight: 4, cpuMilli: 96000, memMiB: 768 << 10, gpus: 8, model: "A100"},
	{weight: 4, cpuMilli: 64000, memMiB: 256 << 10, gpus: 4, model: "T4"},
	{weight: 2, cpuMilli: 32000, memMiB: 128 << 10, gpus: 2, model: "A10"},
	{weight: 1, cpuMilli: 16000, memMiB: 128 << 10, gpus: 2, model: "P100"},
}

type podKind struct {
	weight int
	gen    func(r *rand.Rand) PodSpec
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

// The pod mix, by count, after the openb trace (Alibaba, 2023): about one pod
// in eight CPU-only, half sharing one GPU with a few dominant fractions, a
// quarter whole single GPUs, a few multi-GPU jobs; one GPU pod in ten
// restricted to GPU models.
var syntheticPods = []podKind{
	{weight: 12, gen: func(r *rand.Rand) PodSpec { // CPU-only
		return PodSpec{CPUMilli: 1000 * pick(r, []int64{2, 4, 8, 16}), MemoryMiB: 1024 * pick(r, []int64{4, 8, 16, 64})}
	}},
	{weight: 50, gen: func(r *rand.Rand) PodSpec { // a slice of one GPU
		return PodSpec{CPUMilli: 1000 * pick(r, []int64{2, 4, 6, 8}), MemoryMiB: 1024 * pick(r, []int64{8, 12, 16, 24}),
			NumGPU: 1, GPUMilli: pick(r, []int64{100, 160, 250, 250, 320, 470, 500, 500, 650, 810})}
	}},
	{weight: 30, gen: func(r *rand.Rand) PodSpec { // one whole GPU
		return PodSpec{CPUMilli: 1000 * pick(r, []int64{4, 8, 12, 16}), MemoryMiB: 1024 * pick(r, []int64{16, 24, 32, 64}), NumGPU: 1, GPUMilli: 1000}
	}},
	{weight: 8, gen: func(r *rand.Rand) PodSpec { // multi-GPU jobs
		n := pick(r, []int{2, 4, 8})
		return PodSpec{CPUMilli: 8000 * int64(n), MemoryMiB: 32 << 10 * int64(n), NumGPU: n, GPUMilli: 1000}
	}},
}

var syntheticSpecs = [][]string{{"H100"}, {"A100", "H100"}, {"T4"}, {"A10", "T4"}}

// The built-in workload's mean time between arrivals and mean lifetime,
// in seconds.
const (
	syntheticGap      = 60
	syntheticLifetime = 14 * 3600
)

// Synthetic generates a cluster and pod list from opts: the built-in
// workload `tessera sim` replays when given no trace.
func Synthetic(opts SyntheticOptions) ([]NodeSpec, []PodSpec) {
	if opts.Nodes <= 0 {
		opts.Nodes = 128
	}
	if opts.Pods <= 0 {
		opts.Pods = 2000
	}
	r := rand.New(rand.NewPCG(opts.Seed, 0x5e7))
	nodes := make([]NodeSpec, opts.Nodes)
	for i := range nodes {
		k := weighted(r, syntheticNodes, func(k nodeKind) int { return k.weight })
		nodes[i] = NodeSpec{Name: fmt.Sprintf("synth-node-%03d", i), CPUMilli: k.cpuMilli, MemoryMiB: k.memMiB, GPUs: k.gpus, Model: k.model}
	}
	pods := make([]PodSpec, opts.Pods)
	// Times come from their own stream, so the pods are the same with or
	// without them: a pod every minute on average, staying 14 hours on
	// average, which offers the cluster about 1.1 times its GPUs once the
	// first pods start leaving.
	times := rand.New(rand.NewPCG(opts.Seed, 0x71e))
	var now float64
	for i := range pods {
		p := weighted(r, syntheticPods, func(k podKind) int { return k.weight }).gen(r)
		p.Name = fmt.Sprintf("synth-pod-%04d", i)
		if p.NumGPU > 0 && r.IntN(10) == 0 {
			p.Models = pick(r, syntheticSpecs)
		}
		now += syntheticGap * times.ExpFloat64()
		p.Created = int64(now)
		p.Deleted = p.Created + int64(syntheticLifetime*times.ExpFloat64())
		pods[i] = p
	}
	return nodes, pods
}

func weighted[T any](r *rand.Rand, xs []T, weight func(T) int) T {
	total := 0
	for _, x := range xs {
		total += weight(x)
	}
	k := r.IntN(total)
	for _, x := range xs {
		if k -= weight(x); k < 0 {
			return x
		}
	}
	return xs[len(xs)-1]
}
