// Package config is Tessera's versioned configuration (tessera.dev/v1alpha1):
// the types, their production defaults, strict decoding and validation that
// names the field at fault. Every number an operator may tune lives here; the
// components read it and never hard-code their own.
//
// It must not import Kubernetes or anything that does I/O beyond reading the
// bytes it is given.
package config

import (
	"encoding/json"
	"fmt"
	"time"
)

// APIVersion and Kind identify a Tessera configuration document.
const (
	APIVersion = "tessera.dev/v1alpha1"
	Kind       = "TesseraConfiguration"
)

// Policy names a scoring policy of pkg/allocator.
type Policy string

// The scoring policies. Their meaning is documented in pkg/allocator.
const (
	PolicyBinpack Policy = "binpack"
	PolicySpread  Policy = "spread"
	PolicyFGD     Policy = "fgd"
	PolicyTessera Policy = "tessera"
)

// Policies lists every known policy, in the order tools print them.
var Policies = []Policy{PolicyBinpack, PolicySpread, PolicyFGD, PolicyTessera}

// PolicyFirstFit is upstream DRA's choice, for comparison in the
// simulator only: kube-scheduler's default node score (least allocated
// CPU and memory) picks the node, and the first GPU in index order that
// fits takes the slice, as the structured allocator takes the first
// device of a ResourceSlice. No scheduler runs it.
const PolicyFirstFit Policy = "first-fit"

// ComparisonPolicies are the policies `tessera sim` replays only when
// asked by name: baselines, not choices for tessera-scheduler.
var ComparisonPolicies = []Policy{PolicyFirstFit}

// Configuration is the whole of Tessera's tunable behaviour.
type Configuration struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// Allocator is what the scheduler and the simulator place pods with.
	Allocator AllocatorConfig `json:"allocator"`
	// TimeSlice is the slice length for time-shared GPUs.
	TimeSlice TimeSliceConfig `json:"timeSlice"`
	// Fragments drives the agent's slice adjuster.
	Fragments FragmentConfig `json:"fragments"`
	// Stall is the alert on the stall metric.
	Stall StallConfig `json:"stall"`
	// Health decides when NVML faults take a GPU out of service.
	Health HealthConfig `json:"health"`
	// Preemption is the three-level GPU preemption (scheduler side).
	Preemption PreemptionConfig `json:"preemption"`
}

// PreemptionConfig times GPU preemption: a victim is told to checkpoint and
// given GracePeriod (a pod annotation may shorten it, never lengthen it),
// then stopped with its scene recorded; its slices stay booked until its
// node's agent confirms no process of it holds the GPU, or ReclaimTimeout.
type PreemptionConfig struct {
	GracePeriod Duration `json:"gracePeriod"`
	// RecordRetention is how many scene records (ConfigMaps of hard
	// preemptions) are kept; older ones are deleted.
	RecordRetention int `json:"recordRetention"`
	// ReclaimTimeout bounds the wait for the agent's confirmation: a node
	// whose agent is gone must not hold a victim's slices forever.
	ReclaimTimeout Duration `json:"reclaimTimeout"`
}

// HealthConfig is the agent's fault handling.
type HealthConfig struct {
	// IgnoredXids are XID codes that do not take a GPU out of service
	// (errors applications cause). Unset: the default list; [] ignores none.
	IgnoredXids []uint64 `json:"ignoredXids"`
	// QuietPeriod is how long a faulted GPU must stay free of faults before
	// it takes slices again.
	QuietPeriod Duration `json:"quietPeriod"`
}

// AllocatorConfig configures pkg/allocator.
type AllocatorConfig struct {
	// Policy scores candidate placements.
	Policy Policy `json:"policy"`
	// MemoryOversubscription is how far the sum of memory slices on one shared GPU
	// may exceed its memory: 1.0 means none; at most 1.5 (source material, §7).
	MemoryOversubscription float64 `json:"memoryOversubscription"`
	// ComputeOversubscription must stay 1.0: compute is never oversubscribed
	// (source material, §7). It is a field so that a config asking for more is
	// refused by name instead of silently ignored.
	ComputeOversubscription float64 `json:"computeOversubscription"`
	// MinSliceMiB is the smallest memory slice per workload class; a smaller ask is
	// rounded up to it (source material, §7: 8 GiB training, 4 GiB inference).
	MinSliceMiB MinSlice `json:"minSliceMiB"`
	// WorkloadCoverage is the share of recently seen pods whose request shapes form
	// the target workload of the fgd and tessera policies (FGD paper: 0.95).
	WorkloadCoverage float64 `json:"workloadCoverage"`
}

// MinSlice is a memory minimum per workload class, in MiB.
type MinSlice struct {
	Training  int64 `json:"training"`
	Inference int64 `json:"inference"`
}

// TimeSliceConfig is the time-slice length per workload character. The
// driver takes classes, not lengths, so the agent keeps their order only
// (pkg/agent/timeslice: the longer gets the long class, a shorter the
// medium one); a GPU with an inference tenant is IO-bound.
type TimeSliceConfig struct {
	ComputeBound Duration `json:"computeBound"`
	IOBound      Duration `json:"ioBound"`
}

// FragmentConfig drives the slice adjuster.
type FragmentConfig struct {
	// SampleInterval is how often utilization is sampled.
	SampleInterval Duration `json:"sampleInterval"`
	// DecreaseAbove: fewer, larger slices when forecast utilization exceeds it (0–1).
	DecreaseAbove float64 `json:"decreaseAbove"`
	// IncreaseBelow: more slices when forecast utilization falls below it (0–1).
	IncreaseBelow float64 `json:"increaseBelow"`
	// Window is how much history the forecast is fitted on (source: 5 minutes).
	Window Duration `json:"window"`
	// Horizon is how far ahead the forecast looks (source: 5 minutes).
	Horizon Duration `json:"horizon"`
	// EvaluateEvery is how often a GPU's forecast is refitted and a decision made.
	EvaluateEvery Duration `json:"evaluateEvery"`
	// Consecutive is how many evaluations in a row must cross a threshold
	// before the slice count moves (hysteresis).
	Consecutive int `json:"consecutive"`
	// Cooldown is the least time between two changes of one GPU's slices.
	Cooldown Duration `json:"cooldown"`
	// MinSlices and MaxSlices bound the slices per GPU.
	MinSlices int `json:"minSlices"`
	MaxSlices int `json:"maxSlices"`
	// ARIMA is the forecast model's order (source: ARIMA(5,1,0)).
	ARIMA ARIMAOrder `json:"arima"`
}

// ARIMAOrder is an ARIMA(p,d,q) order.
type ARIMAOrder struct {
	P int `json:"p"`
	D int `json:"d"`
	Q int `json:"q"`
}

// StallConfig is the alert threshold on the stall ratio.
type StallConfig struct {
	Window    Duration `json:"window"`
	Threshold float64  `json:"threshold"`
}

// Duration is a time.Duration written as a Go duration string ("100ms").
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"100ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}
