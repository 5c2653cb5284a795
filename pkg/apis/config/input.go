package config

// The configuration as a person writes it. Every value is a pointer, so a
// field left out (nil) takes its production default and a field written as 0
// (or "0s", or []) stays 0, for Validate to accept or refuse by its name:
// "preemption.recordRetention: 0" is refused as "must be at least 1", and
// "fragments.cooldown: 0s" means no cooldown — with plain fields both were
// taken for "not given" and silently became 100 and 2m.

// ConfigurationInput is a TesseraConfiguration as written.
type ConfigurationInput struct {
	APIVersion *string          `json:"apiVersion"`
	Kind       *string          `json:"kind"`
	Allocator  *AllocatorInput  `json:"allocator"`
	TimeSlice  *TimeSliceInput  `json:"timeSlice"`
	Fragments  *FragmentInput   `json:"fragments"`
	Stall      *StallInput      `json:"stall"`
	Health     *HealthInput     `json:"health"`
	Preemption *PreemptionInput `json:"preemption"`
}

// AllocatorInput is the allocator section as written (also the
// TesseraGPU scheduler plugin's arguments).
type AllocatorInput struct {
	Policy                  *Policy        `json:"policy"`
	MemoryOversubscription  *float64       `json:"memoryOversubscription"`
	ComputeOversubscription *float64       `json:"computeOversubscription"`
	MinSliceMiB             *MinSliceInput `json:"minSliceMiB"`
	WorkloadCoverage        *float64       `json:"workloadCoverage"`
}

// MinSliceInput is allocator.minSliceMiB as written.
type MinSliceInput struct {
	Training  *int64 `json:"training"`
	Inference *int64 `json:"inference"`
}

// TimeSliceInput is the timeSlice section as written.
type TimeSliceInput struct {
	ComputeBound *Duration `json:"computeBound"`
	IOBound      *Duration `json:"ioBound"`
}

// FragmentInput is the fragments section as written.
type FragmentInput struct {
	SampleInterval *Duration   `json:"sampleInterval"`
	DecreaseAbove  *float64    `json:"decreaseAbove"`
	IncreaseBelow  *float64    `json:"increaseBelow"`
	Window         *Duration   `json:"window"`
	Horizon        *Duration   `json:"horizon"`
	EvaluateEvery  *Duration   `json:"evaluateEvery"`
	Consecutive    *int        `json:"consecutive"`
	Cooldown       *Duration   `json:"cooldown"`
	MinSlices      *int        `json:"minSlices"`
	MaxSlices      *int        `json:"maxSlices"`
	ARIMA          *ARIMAInput `json:"arima"`
}

// ARIMAInput is fragments.arima as written; an order left out takes its
// default (5, 1, 0) one by one.
type ARIMAInput struct {
	P *int `json:"p"`
	D *int `json:"d"`
	Q *int `json:"q"`
}

// StallInput is the stall section as written.
type StallInput struct {
	Window    *Duration `json:"window"`
	Threshold *float64  `json:"threshold"`
}

// HealthInput is the health section as written.
type HealthInput struct {
	IgnoredXids *[]uint64 `json:"ignoredXids"`
	QuietPeriod *Duration `json:"quietPeriod"`
}

// PreemptionInput is the preemption section as written.
type PreemptionInput struct {
	GracePeriod     *Duration `json:"gracePeriod"`
	RecordRetention *int      `json:"recordRetention"`
	ReclaimTimeout  *Duration `json:"reclaimTimeout"`
}

// Configuration is the production defaults with every value in's author
// wrote in place of its default. It is not validated.
func (in *ConfigurationInput) Configuration() *Configuration {
	c := Default()
	if in == nil {
		return c
	}
	set(&c.APIVersion, in.APIVersion)
	set(&c.Kind, in.Kind)
	in.Allocator.applyTo(&c.Allocator)
	if t := in.TimeSlice; t != nil {
		set(&c.TimeSlice.ComputeBound, t.ComputeBound)
		set(&c.TimeSlice.IOBound, t.IOBound)
	}
	if f := in.Fragments; f != nil {
		o := &c.Fragments
		set(&o.SampleInterval, f.SampleInterval)
		set(&o.DecreaseAbove, f.DecreaseAbove)
		set(&o.IncreaseBelow, f.IncreaseBelow)
		set(&o.Window, f.Window)
		set(&o.Horizon, f.Horizon)
		set(&o.EvaluateEvery, f.EvaluateEvery)
		set(&o.Consecutive, f.Consecutive)
		set(&o.Cooldown, f.Cooldown)
		set(&o.MinSlices, f.MinSlices)
		set(&o.MaxSlices, f.MaxSlices)
		if a := f.ARIMA; a != nil {
			set(&o.ARIMA.P, a.P)
			set(&o.ARIMA.D, a.D)
			set(&o.ARIMA.Q, a.Q)
		}
	}
	if s := in.Stall; s != nil {
		set(&c.Stall.Window, s.Window)
		set(&c.Stall.Threshold, s.Threshold)
	}
	if h := in.Health; h != nil {
		if h.IgnoredXids != nil {
			c.Health.IgnoredXids = append([]uint64{}, *h.IgnoredXids...)
		}
		set(&c.Health.QuietPeriod, h.QuietPeriod)
	}
	in.Preemption.applyTo(&c.Preemption)
	return c
}

// applyTo writes the values given onto a (defaulted) allocator section.
func (in *AllocatorInput) applyTo(a *AllocatorConfig) {
	if in == nil {
		return
	}
	set(&a.Policy, in.Policy)
	set(&a.MemoryOversubscription, in.MemoryOversubscription)
	set(&a.ComputeOversubscription, in.ComputeOversubscription)
	if m := in.MinSliceMiB; m != nil {
		set(&a.MinSliceMiB.Training, m.Training)
		set(&a.MinSliceMiB.Inference, m.Inference)
	}
	set(&a.WorkloadCoverage, in.WorkloadCoverage)
}

// applyTo writes the values given onto a (defaulted) preemption section.
func (in *PreemptionInput) applyTo(p *PreemptionConfig) {
	if in == nil {
		return
	}
	set(&p.GracePeriod, in.GracePeriod)
	set(&p.RecordRetention, in.RecordRetention)
	set(&p.ReclaimTimeout, in.ReclaimTimeout)
}

// Sections is the production defaults with the allocator and preemption
// values given in place of theirs (the scheduler plugin's arguments carry
// only these two sections). It is not validated.
func Sections(allocator *AllocatorInput, preemption *PreemptionInput) *Configuration {
	c := Default()
	allocator.applyTo(&c.Allocator)
	preemption.applyTo(&c.Preemption)
	return c
}

// set writes *v to dst when v was given.
func set[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}
