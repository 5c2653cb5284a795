package allocator

import "github.com/tessera-gpu/tessera/pkg/gpu"

// Tessera reports one fragmentation figure, defined and computed here only,
// for the scheduler's metrics (and so the dashboard), tessera top and its
// web view, and tessera sim:
//
//	fragmentation = Σ_n F_n(M) / Σ_n free_n
//
// free_n is node n's free GPU compute in GPUs, counted on healthy GPUs (a GPU
// with 30 % of its SMs booked is 0.7 free). F_n(M) is the FGD paper's
// expected fragmentation of n under the workload M (Workload.Fragmentation):
// the part of free_n that M's pods cannot use, weighted by how common each
// pod shape is. M is the GPU pods present — placed and waiting — each shape
// counted once per pod, the most common covering the configured share
// (NewWorkload). With no GPU pod present nothing is wasted on any pod: 0.
//
// The scheduler's scoring policies score against the requests it saw last
// (a window that follows a changing mix); the reported figure is measured
// against the pods present, which every reader of the cluster sees alike.

// Fragmentation is free and fragmented GPU compute, in GPUs.
type Fragmentation struct {
	FreeGPUs       float64 `json:"freeGPUs"`
	FragmentedGPUs float64 `json:"fragmentedGPUs"`
	// Shapes is how many request shapes made the workload M.
	Shapes int `json:"shapes"`
}

// Ratio is the fragmented share of the free compute, 0 when nothing is free.
func (f Fragmentation) Ratio() float64 {
	if f.FreeGPUs <= 0 {
		return 0
	}
	return f.FragmentedGPUs / f.FreeGPUs
}

// PresentWorkload is M for the requests of the GPU pods present; nil when
// there are none (or coverage is out of range).
func PresentWorkload(present []*Request, coverage float64) *Workload {
	if len(present) == 0 {
		return nil
	}
	counts := make([]ShapeCount, len(present))
	for i, r := range present {
		counts[i] = ShapeCount{Request: r, Count: 1}
	}
	w, err := NewWorkload(counts, coverage)
	if err != nil {
		return nil
	}
	return w
}

// NodeFragmentation is one node's free and fragmented GPU compute under w
// (nil: nothing fragmented).
func NodeFragmentation(n *Node, w *Workload, oversub float64) Fragmentation {
	f := Fragmentation{FreeGPUs: float64(n.GPUFree()) / gpu.CoresPerGPU}
	if w != nil {
		f.FragmentedGPUs = w.Fragmentation(n, oversub) / gpu.CoresPerGPU
		f.Shapes = w.Len()
	}
	return f
}

// MeasureFragmentation is the cluster's figure: every node's free and
// fragmented compute under w, summed.
func MeasureFragmentation(nodes []*Node, w *Workload, oversub float64) Fragmentation {
	var total Fragmentation
	if w != nil {
		total.Shapes = w.Len()
	}
	for _, n := range nodes {
		f := NodeFragmentation(n, w, oversub)
		total.FreeGPUs += f.FreeGPUs
		total.FragmentedGPUs += f.FragmentedGPUs
	}
	return total
}
