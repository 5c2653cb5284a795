package scheduler

import (
	"sync"

	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/component-base/metrics"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
)

var (
	nodeFreeGPUsDesc = metrics.NewDesc("tessera_scheduler_node_free_gpus",
		"Unallocated compute of a node's healthy GPUs, in GPUs (a half-used GPU counts 0.5).",
		[]string{"node"}, nil, metrics.ALPHA, "")
	nodeFragmentedGPUsDesc = metrics.NewDesc("tessera_scheduler_node_fragmented_gpus",
		"Of a node's free GPU compute, in GPUs, what the GPU pods present (placed and waiting) cannot use: "+
			"the FGD paper's F_n(M), Tessera's one fragmentation (allocator.MeasureFragmentation), as tessera top and tessera sim report it.",
		[]string{"node"}, nil, metrics.ALPHA, "")
)

// fragmentationCollector exports, at each scrape, every node's free and
// fragmented GPU compute (allocator.NodeFragmentation) from the cache, as
// of that moment, against the workload of the GPU pods present read from
// the pod lister: the figure tessera top, its web view and tessera sim show
// for the same cluster. Like pendingCollector, one serves the process; the
// newest plugin's cache and lister are the ones it reads.
type fragmentationCollector struct {
	metrics.BaseStableCollector

	mu   sync.Mutex
	src  *cache.Cache
	pods corelisters.PodLister
	cfg  *config.AllocatorConfig
}

var fragmentation = &fragmentationCollector{}

func (c *fragmentationCollector) set(cache *cache.Cache, pods corelisters.PodLister, cfg *config.AllocatorConfig) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.src, c.pods, c.cfg = cache, pods, cfg
}

func (c *fragmentationCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- nodeFreeGPUsDesc
	ch <- nodeFragmentedGPUsDesc
}

func (c *fragmentationCollector) CollectWithStability(ch chan<- metrics.Metric) {
	c.mu.Lock()
	cache, pods, cfg := c.src, c.pods, c.cfg
	c.mu.Unlock()
	if cache == nil || !cache.Reporting() {
		return // no scheduler, or a stopped one: its view is not the cluster's
	}
	all, err := pods.List(labels.Everything())
	if err != nil {
		return
	}
	var present []*allocator.Request
	for _, p := range all {
		if !podgpu.WantsGPU(p) || podgpu.Finished(p) {
			continue
		}
		if r, err := podgpu.Request(p, cfg.MinSliceMiB); err == nil {
			present = append(present, r)
		}
	}
	w := allocator.PresentWorkload(present, cfg.WorkloadCoverage)
	for _, name := range cache.NodeNames() {
		n := cache.Snapshot(name)
		if n == nil {
			continue
		}
		f := allocator.NodeFragmentation(n, w, cfg.MemoryOversubscription)
		ch <- metrics.NewLazyConstMetric(nodeFreeGPUsDesc, metrics.GaugeValue, f.FreeGPUs, name)
		ch <- metrics.NewLazyConstMetric(nodeFragmentedGPUsDesc, metrics.GaugeValue, f.FragmentedGPUs, name)
	}
}
