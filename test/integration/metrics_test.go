package integration

import (
	"strconv"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// gauge reads one series from the registry the scheduler's /metrics endpoint
// serves (the scheduler runs in this process). labels nil matches the
// unlabelled series. It returns -1 when the series is missing.
func gauge(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range series(families, name, labels) {
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// series are the metrics of the family name whose labels include labels.
func series(families []*dto.MetricFamily, name string, labels map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// checkMetrics compares the scheduler's per-GPU series with an independent
// recount from the pods' assignments, and checks the latency histograms.
func checkMetrics(t *testing.T, nodes map[string]*allocator.Node) {
	t.Helper()
	for name, n := range nodes {
		free := gauge(t, "tessera_scheduler_node_free_gpus", map[string]string{"node": name})
		if want := float64(n.GPUFree()) / gpu.CoresPerGPU; free != want {
			t.Errorf("node %s: free GPUs metric %v, recount %v", name, free, want)
		}
		if frag := gauge(t, "tessera_scheduler_node_fragmented_gpus", map[string]string{"node": name}); frag < 0 || frag > free {
			t.Errorf("node %s: fragmented GPUs %v, want within 0–%v (free)", name, frag, free)
		}
		for _, g := range n.GPUs {
			l := map[string]string{"node": name, "gpu": strconv.Itoa(g.Index), "UUID": g.UUID}
			if got, want := gauge(t, "tessera_scheduler_gpu_allocated_slices", l), float64(g.Tenants()); got != want {
				t.Errorf("%s slices metric %v, recount %v", g.UUID, got, want)
			}
			if got, want := gauge(t, "tessera_scheduler_gpu_allocated_memory_bytes", l), float64(g.MemoryUsedMiB())*(1<<20); got != want {
				t.Errorf("%s memory metric %v, recount %v", g.UUID, got, want)
			}
			if got, want := gauge(t, "tessera_scheduler_gpu_allocated_cores_ratio", l), float64(g.CoresUsed())/gpu.CoresPerGPU; got != want {
				t.Errorf("%s cores metric %v, recount %v", g.UUID, got, want)
			}
			if got, want := gauge(t, "tessera_scheduler_gpu_healthy", l), map[bool]float64{true: 1, false: 0}[g.Healthy]; got != want {
				t.Errorf("%s healthy metric %v, inventory %v", g.UUID, got, want)
			}
		}
	}
	// Counters an alert or panel reads exist at 0 before their first
	// event, so that event is an increase (issue 39: a series born at 1
	// has none, and TesseraInventoryErrors could not fire).
	for name := range nodes {
		if v := gauge(t, "tessera_scheduler_inventory_errors_total", map[string]string{"node": name}); v < 0 {
			t.Errorf("node %s: no tessera_scheduler_inventory_errors_total series before any error", name)
		}
	}
	for _, reason := range []string{"InvalidRequest", "TooManyGPUs", "NoInventory", "InsufficientSlots"} {
		if v := gauge(t, "tessera_scheduler_unschedulable_total", map[string]string{"reason": reason}); v < 0 {
			t.Errorf("no tessera_scheduler_unschedulable_total{reason=%q} series", reason)
		}
	}
	for _, point := range []string{"PreFilter", "Filter", "Score", "Reserve", "Bind"} {
		if n := gauge(t, "tessera_scheduler_plugin_duration_seconds", map[string]string{"extension_point": point}); n <= 0 {
			t.Errorf("no %s latency observed", point)
		}
	}
}
