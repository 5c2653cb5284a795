package config

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// FieldError says which field is wrong, what it holds and why.
type FieldError struct {
	Field  string
	Value  any
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: invalid value %v: %s", e.Field, e.Value, e.Reason)
}

// Validate checks a defaulted configuration and returns every problem, each a
// *FieldError naming its field (errors.Join of them), or nil.
func Validate(c *Configuration) error {
	var errs []error
	bad := func(field string, value any, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: value, Reason: reason})
	}
	if c.APIVersion != APIVersion {
		bad("apiVersion", c.APIVersion, "want "+APIVersion)
	}
	if c.Kind != Kind {
		bad("kind", c.Kind, "want "+Kind)
	}
	a := c.Allocator
	if !KnownPolicy(a.Policy) {
		bad("allocator.policy", a.Policy, "want one of "+policyList())
	}
	if !finite(a.MemoryOversubscription) || a.MemoryOversubscription < 1 || a.MemoryOversubscription > MaxMemoryOversubscription {
		bad("allocator.memoryOversubscription", a.MemoryOversubscription, fmt.Sprintf("must be between 1.0 and %.1f", MaxMemoryOversubscription))
	}
	if a.ComputeOversubscription != 1 {
		bad("allocator.computeOversubscription", a.ComputeOversubscription, "compute is never oversubscribed: must be 1.0")
	}
	if a.MinSliceMiB.Training <= 0 {
		bad("allocator.minSliceMiB.training", a.MinSliceMiB.Training, "must be positive")
	}
	if a.MinSliceMiB.Inference <= 0 {
		bad("allocator.minSliceMiB.inference", a.MinSliceMiB.Inference, "must be positive")
	}
	if !finite(a.WorkloadCoverage) || a.WorkloadCoverage <= 0 || a.WorkloadCoverage > 1 {
		bad("allocator.workloadCoverage", a.WorkloadCoverage, "must be in (0, 1]")
	}
	positive := func(field string, d Duration) {
		if d.Duration <= 0 {
			bad(field, d.Duration, "must be positive")
		}
	}
	positive("timeSlice.computeBound", c.TimeSlice.ComputeBound)
	positive("timeSlice.ioBound", c.TimeSlice.IOBound)
	positive("fragments.sampleInterval", c.Fragments.SampleInterval)
	positive("stall.window", c.Stall.Window)
	positive("health.quietPeriod", c.Health.QuietPeriod)
	positive("preemption.gracePeriod", c.Preemption.GracePeriod)
	positive("preemption.reclaimTimeout", c.Preemption.ReclaimTimeout)
	if c.Preemption.RecordRetention < 1 {
		bad("preemption.recordRetention", c.Preemption.RecordRetention, "must be at least 1")
	}
	if c.Fragments.SampleInterval.Duration > 0 && c.Fragments.SampleInterval.Duration < 10*time.Millisecond {
		bad("fragments.sampleInterval", c.Fragments.SampleInterval.Duration, "below 10ms NVML utilization samples repeat")
	}
	f := c.Fragments
	if !fraction(f.DecreaseAbove) {
		bad("fragments.decreaseAbove", f.DecreaseAbove, "must be in (0, 1]")
	}
	if !fraction(f.IncreaseBelow) {
		bad("fragments.increaseBelow", f.IncreaseBelow, "must be in (0, 1]")
	}
	if fraction(f.DecreaseAbove) && fraction(f.IncreaseBelow) && f.IncreaseBelow >= f.DecreaseAbove {
		bad("fragments.increaseBelow", f.IncreaseBelow, fmt.Sprintf("must be below fragments.decreaseAbove (%v), or slices would flap", f.DecreaseAbove))
	}
	positive("fragments.window", f.Window)
	positive("fragments.horizon", f.Horizon)
	positive("fragments.evaluateEvery", f.EvaluateEvery)
	if f.Cooldown.Duration < 0 {
		bad("fragments.cooldown", f.Cooldown.Duration, "must not be negative")
	}
	if f.SampleInterval.Duration > 0 && f.Window.Duration > 0 {
		if n := f.Window.Duration / f.SampleInterval.Duration; n < 50 || n > 100000 {
			bad("fragments.window", f.Window.Duration, fmt.Sprintf("holds %d samples at fragments.sampleInterval %v; want 50–100000", n, f.SampleInterval.Duration))
		}
	}
	if f.Consecutive < 1 {
		bad("fragments.consecutive", f.Consecutive, "must be at least 1")
	}
	if f.MinSlices < 1 {
		bad("fragments.minSlices", f.MinSlices, "must be at least 1")
	}
	if f.MaxSlices < f.MinSlices {
		bad("fragments.maxSlices", f.MaxSlices, fmt.Sprintf("must be at least fragments.minSlices (%d)", f.MinSlices))
	}
	if o := f.ARIMA; o.P < 0 || o.P > 8 || o.D < 0 || o.D > 2 || o.Q < 0 || o.Q > 2 {
		bad("fragments.arima", fmt.Sprintf("(%d,%d,%d)", o.P, o.D, o.Q), "want p ≤ 8, d ≤ 2, q ≤ 2")
	}
	if !fraction(c.Stall.Threshold) {
		bad("stall.threshold", c.Stall.Threshold, "must be in (0, 1]")
	}
	return errors.Join(errs...)
}

// KnownPolicy reports whether p names a scoring policy.
func KnownPolicy(p Policy) bool {
	for _, k := range Policies {
		if p == k {
			return true
		}
	}
	return false
}

// SimPolicy reports whether the simulator replays p: a known policy or a
// comparison baseline.
func SimPolicy(p Policy) bool {
	return KnownPolicy(p) || slices.Contains(ComparisonPolicies, p)
}

func policyList() string {
	names := make([]string, len(Policies))
	for i, p := range Policies {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

func finite(f float64) bool   { return !math.IsNaN(f) && !math.IsInf(f, 0) }
func fraction(f float64) bool { return finite(f) && f > 0 && f <= 1 }
