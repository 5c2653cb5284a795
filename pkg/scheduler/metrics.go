package scheduler

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	kubemetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

const metricsSubsystem = "tessera_scheduler"

// gpuLabels identify one GPU in the per-GPU series, as the agent's do.
var gpuLabels = gpu.SeriesLabels

var (
	gpuAllocatedMemory = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "gpu_allocated_memory_bytes",
		Help:           "GPU memory booked by the pods assigned to a GPU (may exceed its memory up to the oversubscription ratio).",
		StabilityLevel: metrics.ALPHA,
	}, gpuLabels)
	gpuAllocatedCores = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "gpu_allocated_cores_ratio",
		Help:           "Share of a GPU's SMs booked by the pods assigned to it (0–1; never above 1).",
		StabilityLevel: metrics.ALPHA,
	}, gpuLabels)
	gpuAllocatedSlices = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "gpu_allocated_slices",
		Help:           "Number of container slices assigned to a GPU.",
		StabilityLevel: metrics.ALPHA,
	}, gpuLabels)
	gpuMemoryTotal = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "gpu_memory_bytes",
		Help:           "GPU memory as the node's inventory reports it.",
		StabilityLevel: metrics.ALPHA,
	}, gpuLabels)
	gpuHealthy = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "gpu_healthy",
		Help:           "1 while the node's inventory reports the GPU healthy, 0 while it is out of service: what the scheduler places by, there even when the node's agent is not scraped.",
		StabilityLevel: metrics.ALPHA,
	}, gpuLabels)
	unschedulable = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "unschedulable_total",
		Help:           "Rejections by the TesseraGPU plugin: of a pod by PreFilter (InvalidRequest, TooManyGPUs), and of a node for a pod by Filter or, when no node fits, by being left out of PreFilter's candidates, by reason.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"reason"})
	pluginDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem:      metricsSubsystem,
		Name:           "plugin_duration_seconds",
		Help:           "Latency of the TesseraGPU plugin's extension points.",
		Buckets:        metrics.ExponentialBuckets(1e-6, 4, 12), // 1 µs … 4 s
		StabilityLevel: metrics.ALPHA,
	}, []string{"extension_point"})
	orphanedPods = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "orphaned_pods",
		Help:           "Bound GPU pods whose assignment is not counted on any node: their node has no usable inventory.",
		StabilityLevel: metrics.ALPHA,
	})
	inventoryErrors = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "inventory_errors_total",
		Help:           "Node inventories (tessera.dev/inventory) the scheduler could not use, by node.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"node"})
	assignmentChanges = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "assignment_changes_total",
		Help:           "Changes of a bound pod's GPU assignment after binding, each ignored: the first assignment stays booked.",
		StabilityLevel: metrics.ALPHA,
	})
	assignmentErrors = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "assignment_errors_total",
		Help:           "Bound pods whose assignment annotation could not be decoded or booked.",
		StabilityLevel: metrics.ALPHA,
	})
	preemptions = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "preemptions_total",
		Help:           "GPU preemption attempts by result: started (victims notified), impossible (no set of victims makes the pod fit; no one evicted), conflict (a victim changed meanwhile; retried).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"result"})
	victimsPerPreemption = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem:      metricsSubsystem,
		Name:           "preemption_victims",
		Help:           "Victims per started GPU preemption.",
		Buckets:        []float64{1, 2, 3, 4, 6, 8, 12, 16},
		StabilityLevel: metrics.ALPHA,
	})
	awaitingReclaim = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem:      metricsSubsystem,
		Name:           "preemption_awaiting_reclaim",
		Help:           "Preemption victims gone from the API server whose slices stay booked until their node's agent confirms their GPUs clean.",
		StabilityLevel: metrics.ALPHA,
	})
	reclaimTimeouts = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem:      metricsSubsystem,
		Name:           "preemption_reclaim_timeouts_total",
		Help:           "Victims released without their agent's confirmation after preemption.reclaimTimeout.",
		StabilityLevel: metrics.ALPHA,
	})
)

var registerOnce sync.Once

// collectors are the plugin's metrics, as registered.
func collectors() []metrics.Registerable {
	return []metrics.Registerable{gpuAllocatedMemory, gpuAllocatedCores, gpuAllocatedSlices, gpuMemoryTotal, gpuHealthy,
		unschedulable, pluginDuration, orphanedPods, inventoryErrors, assignmentErrors, assignmentChanges,
		preemptions, victimsPerPreemption, awaitingReclaim, reclaimTimeouts}
}

// MetricDescs describes every metric family the plugin exports, and the
// kube-scheduler families Tessera's dashboard reads from the same endpoint,
// from the metrics' own descriptors (registering them first, as the
// scheduler does): what dashboards and rules may name.
func MetricDescs() []*prometheus.Desc {
	registerMetrics()
	kubemetrics.Register()
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range collectors() {
			c.Describe(ch)
		}
		pending.Describe(ch)
		fragmentation.Describe(ch)
		kubemetrics.PodSchedulingSLIDuration.Describe(ch)
		close(ch)
	}()
	var out []*prometheus.Desc
	for d := range ch {
		out = append(out, d)
	}
	return out
}

// registerMetrics adds the plugin's metrics to the scheduler's registry, the
// one its /metrics endpoint serves. Several plugin instances (profiles, or a
// restart inside one process) share them.
func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(collectors()...)
		legacyregistry.CustomMustRegister(pending)
		legacyregistry.CustomMustRegister(fragmentation)
		// A vector's series are live only once it is registered.
		resolveHotSeries()
	})
}

// The series Filter and Score touch once per node per pod, resolved once:
// WithLabelValues hashes its labels and takes a lock on every call, which a
// 1,000-node cluster's scheduling profile showed. Until registerMetrics runs
// they are the vectors' no-op series.
var (
	filterDuration, scoreDuration      metrics.ObserverMetric
	rejectedNodes                      [allocator.NumCodes]metrics.CounterMetric
	rejectedNoInventory, rejectedSlots metrics.CounterMetric
	// PreFilter's refusals of a pod: exported at 0 from the start, so the
	// first one is an increase (a series born at 1 has none).
	rejectedInvalid, rejectedTooManyGPUs metrics.CounterMetric
)

func init() { resolveHotSeries() }

func resolveHotSeries() {
	filterDuration = pluginDuration.WithLabelValues("Filter")
	scoreDuration = pluginDuration.WithLabelValues("Score")
	for c := range rejectedNodes {
		rejectedNodes[c] = unschedulable.WithLabelValues(allocator.Code(c).String())
	}
	rejectedNoInventory = unschedulable.WithLabelValues("NoInventory")
	rejectedSlots = unschedulable.WithLabelValues("InsufficientSlots")
	rejectedInvalid = unschedulable.WithLabelValues("InvalidRequest")
	rejectedTooManyGPUs = unschedulable.WithLabelValues("TooManyGPUs")
}

// timedCycleEvery: Filter and Score, called once per node, record their
// latency in one GPU cycle of this many (the first included), as the
// framework samples its own plugin timings: two clock reads and a histogram
// update per node were a sixth of the plugin's Filter in a 1,000-node
// profile.
const timedCycleEvery = 10

// observeSince records a per-node extension point's latency since start.
func observeSince(o metrics.ObserverMetric, start time.Time) {
	o.Observe(time.Since(start).Seconds())
}

// recordNode sets the per-GPU series of a node from its usage.
func recordNode(name string, n *allocator.Node) {
	for i := range n.GPUs {
		g := &n.GPUs[i]
		lv := gpu.SeriesLabelValues(name, g.Index, g.UUID, g.Model)
		gpuAllocatedMemory.WithLabelValues(lv...).Set(float64(g.MemoryUsedMiB()) * (1 << 20))
		gpuAllocatedCores.WithLabelValues(lv...).Set(float64(g.CoresUsed()) / gpu.CoresPerGPU)
		gpuAllocatedSlices.WithLabelValues(lv...).Set(float64(g.Tenants()))
		gpuMemoryTotal.WithLabelValues(lv...).Set(float64(g.MemoryMiB) * (1 << 20))
		healthy := 0.0
		if g.Healthy {
			healthy = 1
		}
		gpuHealthy.WithLabelValues(lv...).Set(healthy)
	}
}

// forgetNode drops the per-GPU series of a node that is gone.
func forgetNode(name string, gpus []allocator.GPU) {
	for i := range gpus {
		g := &gpus[i]
		lv := gpu.SeriesLabelValues(name, g.Index, g.UUID, g.Model)
		gpuAllocatedMemory.DeleteLabelValues(lv...)
		gpuAllocatedCores.DeleteLabelValues(lv...)
		gpuAllocatedSlices.DeleteLabelValues(lv...)
		gpuMemoryTotal.DeleteLabelValues(lv...)
		gpuHealthy.DeleteLabelValues(lv...)
	}
}

// observe records an extension point's latency since start.
func observe(point string, start time.Time) {
	pluginDuration.WithLabelValues(point).Observe(time.Since(start).Seconds())
}
