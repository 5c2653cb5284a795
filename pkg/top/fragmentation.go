package top

import (
	"sort"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Fragmentation is the cluster's free GPU compute and how much of it the
// typical GPU pods cannot use, in GPUs (a half-used GPU is 0.5 free).
type Fragmentation struct {
	FreeGPUs       float64 `json:"freeGPUs"`
	FragmentedGPUs float64 `json:"fragmentedGPUs"`
	// Shapes is how many distinct request shapes made the workload.
	Shapes int `json:"shapes"`
}

// Ratio is the fragmented share of the free compute, 0 when nothing is free.
func (f Fragmentation) Ratio() float64 {
	if f.FreeGPUs <= 0 {
		return 0
	}
	return f.FragmentedGPUs / f.FreeGPUs
}

// placedPod is a bound GPU pod's booking, for the fragmentation account.
type placedPod struct {
	assignment       *gpu.PodAssignment
	cpuMilli, memMiB int64
}

// measureFragmentation books every placed pod on its node and measures,
// against a workload made of every GPU pod's request (those placed and those
// waiting: the cluster's typical and waiting pods), the FGD paper's
// fragmentation F_n(M) summed over nodes: the free GPU compute no such pod
// can use. A booking that does not fit its node (a stale inventory) is
// forced, as the scheduler's cache does.
func measureFragmentation(invs []*gpu.NodeInventory, placed map[string][]placedPod, requests []*allocator.Request) Fragmentation {
	cfg := config.Default().Allocator
	counts := map[string]*allocator.ShapeCount{}
	for _, req := range requests {
		if sc := counts[req.Key()]; sc != nil {
			sc.Count++
		} else {
			counts[req.Key()] = &allocator.ShapeCount{Request: req, Count: 1}
		}
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	shapes := make([]allocator.ShapeCount, 0, len(keys))
	for _, k := range keys {
		shapes = append(shapes, *counts[k])
	}
	var out Fragmentation
	var a *allocator.Allocator
	if w, err := allocator.NewWorkload(shapes, cfg.WorkloadCoverage); err == nil {
		if a, err = allocator.New(&cfg, w); err == nil {
			out.Shapes = w.Len()
		}
	}
	for _, inv := range invs {
		n, err := allocator.NewNode(inv)
		if err != nil {
			continue
		}
		for _, p := range placed[inv.Node] {
			if err := n.AddAssignment(p.assignment, p.cpuMilli, p.memMiB, cfg.MemoryOversubscription); err != nil {
				n.ForceAssignment(p.assignment, p.cpuMilli, p.memMiB)
			}
		}
		out.FreeGPUs += float64(n.GPUFree()) / gpu.CoresPerGPU
		if a != nil {
			if f, ok := a.Fragmentation(n); ok {
				out.FragmentedGPUs += f / gpu.CoresPerGPU
			}
		}
	}
	return out
}
