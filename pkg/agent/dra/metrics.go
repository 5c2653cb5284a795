package dra

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Refusal reasons, the label of tessera_dra_prepare_refusals_total.
const (
	refusedNoCapacity    = "no-capacity"
	refusedOvercommitted = "overcommitted"
	refusedLeavesSlice   = "pod-leaves-slice"
	refusedNotTessera    = "not-tessera-scheduled"
	refusedReclaiming    = "reclaiming"
	refusedOther         = "other"
)

var refusalReasons = []string{refusedNoCapacity, refusedOvercommitted, refusedLeavesSlice, refusedNotTessera, refusedReclaiming, refusedOther}

// refusalReason classifies why a claim was refused.
func refusalReason(err error) string {
	switch {
	case errors.Is(err, ErrCapacityMissing):
		return refusedNoCapacity
	case errors.Is(err, ErrOvercommitted):
		return refusedOvercommitted
	case errors.Is(err, ErrLeavesSlice):
		return refusedLeavesSlice
	case errors.Is(err, ErrNotTesseraScheduled):
		return refusedNotTessera
	case errors.Is(err, ErrReclaiming):
		return refusedReclaiming
	}
	return refusedOther
}

// newMetrics are the driver's series for node: the claims prepared now,
// and the prepares refused by reason (at 0 from the start, so that a
// rule's increase() sees the first).
func (d *Driver) newMetrics() {
	d.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tessera_dra_prepare_refusals_total",
		Help: "Claims of the gpu.tessera.dev driver the node's agent refused to prepare, by reason: no-capacity (the allocation says not what it consumed), overcommitted (more than the GPU has, counting what it holds), pod-leaves-slice (a pod it is reserved for could leave its slice), not-tessera-scheduled (a pod it is reserved for names a scheduler without TesseraGPU), reclaiming (a preempted pod's leftover processes may still hold its GPU; kubelet retries), other.",
	}, []string{"node", "reason"})
	for _, r := range refusalReasons {
		d.refusals.WithLabelValues(d.cfg.Node, r)
	}
	d.prepared = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tessera_dra_claims_prepared", Help: "Claims of the gpu.tessera.dev driver prepared on the node now.",
		ConstLabels: prometheus.Labels{"node": d.cfg.Node},
	}, func() float64 {
		d.mu.Lock()
		defer d.mu.Unlock()
		n := 0
		for _, rec := range d.claims {
			if rec.State == statePrepared {
				n++
			}
		}
		return float64(n)
	})
}

// Collectors are the driver's series, for the agent's registry.
func (d *Driver) Collectors() []prometheus.Collector {
	return []prometheus.Collector{d.refusals, d.prepared}
}
