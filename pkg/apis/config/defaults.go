package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"sigs.k8s.io/yaml"
)

// Production defaults. They come from the source material's §7 "golden
// parameters" unless noted.
const (
	DefaultPolicy                  = PolicyTessera
	DefaultMemoryOversubscription  = 1.5
	MaxMemoryOversubscription      = 1.5
	DefaultComputeOversubscription = 1.0
	DefaultMinSliceTrainingMiB     = 8 << 10
	DefaultMinSliceInferenceMiB    = 4 << 10
	// DefaultWorkloadCoverage is the FGD paper's: the request shapes that together
	// make up 95 % of pods form the target workload.
	DefaultWorkloadCoverage      = 0.95
	DefaultTimeSliceComputeBound = 100 * time.Millisecond
	DefaultTimeSliceIOBound      = 50 * time.Millisecond
	DefaultSampleInterval        = 500 * time.Millisecond
	DefaultDecreaseAbove         = 0.85
	DefaultIncreaseBelow         = 0.40
	DefaultWindow                = 5 * time.Minute
	DefaultHorizon               = 5 * time.Minute
	DefaultEvaluateEvery         = 10 * time.Second
	DefaultConsecutive           = 12 // two minutes of evaluations every 10 s
	DefaultCooldown              = 2 * time.Minute
	DefaultMinSlices             = 1
	DefaultMaxSlices             = 8
	DefaultStallWindow           = 5 * time.Minute
	DefaultStallThreshold        = 0.15
	// DefaultQuietPeriod: a faulted GPU returns after 5 minutes without faults.
	DefaultQuietPeriod = 5 * time.Minute
	// DefaultGracePeriod is the victim's time to checkpoint (kubelet's own
	// default termination grace period).
	DefaultGracePeriod     = 30 * time.Second
	DefaultRecordRetention = 100
	DefaultReclaimTimeout  = 2 * time.Minute
)

// DefaultIgnoredXids are the XIDs an application causes, not the GPU (the
// list NVIDIA's device plugin skips): 13 graphics engine exception, 31 GPU
// memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68
// video processor exception, 109 context switch timeout.
var DefaultIgnoredXids = []uint64{13, 31, 43, 45, 68, 109}

// Default returns a configuration with every field at its production default.
func Default() *Configuration {
	c := &Configuration{}
	SetDefaults(c)
	return c
}

// SetDefaults fills every zero field of c with its production default: for
// a configuration built in code. What a person writes is read as a
// ConfigurationInput (Load, the scheduler plugin's arguments), where a field
// written as 0 is a value, not a field left out.
func SetDefaults(c *Configuration) {
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
	}
	a := &c.Allocator
	if a.Policy == "" {
		a.Policy = DefaultPolicy
	}
	if a.MemoryOversubscription == 0 {
		a.MemoryOversubscription = DefaultMemoryOversubscription
	}
	if a.ComputeOversubscription == 0 {
		a.ComputeOversubscription = DefaultComputeOversubscription
	}
	if a.MinSliceMiB.Training == 0 {
		a.MinSliceMiB.Training = DefaultMinSliceTrainingMiB
	}
	if a.MinSliceMiB.Inference == 0 {
		a.MinSliceMiB.Inference = DefaultMinSliceInferenceMiB
	}
	if a.WorkloadCoverage == 0 {
		a.WorkloadCoverage = DefaultWorkloadCoverage
	}
	setDuration(&c.TimeSlice.ComputeBound, DefaultTimeSliceComputeBound)
	setDuration(&c.TimeSlice.IOBound, DefaultTimeSliceIOBound)
	setDuration(&c.Fragments.SampleInterval, DefaultSampleInterval)
	if c.Fragments.DecreaseAbove == 0 {
		c.Fragments.DecreaseAbove = DefaultDecreaseAbove
	}
	if c.Fragments.IncreaseBelow == 0 {
		c.Fragments.IncreaseBelow = DefaultIncreaseBelow
	}
	f := &c.Fragments
	setDuration(&f.Window, DefaultWindow)
	setDuration(&f.Horizon, DefaultHorizon)
	setDuration(&f.EvaluateEvery, DefaultEvaluateEvery)
	setDuration(&f.Cooldown, DefaultCooldown)
	if f.Consecutive == 0 {
		f.Consecutive = DefaultConsecutive
	}
	if f.MinSlices == 0 {
		f.MinSlices = DefaultMinSlices
	}
	if f.MaxSlices == 0 {
		f.MaxSlices = DefaultMaxSlices
	}
	if f.ARIMA == (ARIMAOrder{}) {
		// Source material §4.1: ARIMA(5,1,0).
		f.ARIMA = ARIMAOrder{P: 5, D: 1, Q: 0}
	}
	setDuration(&c.Stall.Window, DefaultStallWindow)
	if c.Health.IgnoredXids == nil {
		c.Health.IgnoredXids = append([]uint64(nil), DefaultIgnoredXids...)
	}
	setDuration(&c.Health.QuietPeriod, DefaultQuietPeriod)
	setDuration(&c.Preemption.GracePeriod, DefaultGracePeriod)
	setDuration(&c.Preemption.ReclaimTimeout, DefaultReclaimTimeout)
	if c.Preemption.RecordRetention == 0 {
		c.Preemption.RecordRetention = DefaultRecordRetention
	}
	if c.Stall.Threshold == 0 {
		c.Stall.Threshold = DefaultStallThreshold
	}
}

func setDuration(d *Duration, v time.Duration) {
	if d.Duration == 0 {
		d.Duration = v
	}
}

// Load decodes a YAML or JSON configuration strictly (an unknown or misspelt
// field is an error), gives every field left out its default and validates
// it: a field written as 0 is validated as 0.
func Load(data []byte) (*Configuration, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	in := &ConfigurationInput{}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(in); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c := in.Configuration()
	if err := Validate(c); err != nil {
		return nil, err
	}
	return c, nil
}
