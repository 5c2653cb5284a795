package top

import (
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Fragmentation is the cluster's free GPU compute and how much of it the
// GPU pods present cannot use, in GPUs: allocator.Fragmentation, the one
// figure Tessera reports.
type Fragmentation = allocator.Fragmentation

// placedPod is a bound GPU pod's booking, for the fragmentation account.
type placedPod struct {
	assignment       *gpu.PodAssignment
	cpuMilli, memMiB int64
}

// measureFragmentation books every placed pod on its node and measures the
// cluster's fragmentation (allocator.MeasureFragmentation) against the
// workload of every GPU pod present, placed and waiting
// (allocator.PresentWorkload). A booking that does not fit its node (a stale
// inventory) is forced, as the scheduler's cache does.
func measureFragmentation(invs []*gpu.NodeInventory, placed map[string][]placedPod, requests []*allocator.Request) Fragmentation {
	cfg := config.Default().Allocator
	var nodes []*allocator.Node
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
		nodes = append(nodes, n)
	}
	return allocator.MeasureFragmentation(nodes, allocator.PresentWorkload(requests, cfg.WorkloadCoverage), cfg.MemoryOversubscription)
}
