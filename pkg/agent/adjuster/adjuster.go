// Package adjuster resizes the number of slices a GPU is cut into from a
// forecast of its utilization (source material §4.1): utilization sampled every
// 500 ms, an ARIMA(5,1,0) fitted on the last 5 minutes and forecast 5 minutes
// ahead; fewer, larger slices when the forecast exceeds 85 %, more slices when
// it falls below 40 %.
//
// The decision core (Adjuster) is deterministic and does no I/O: samples and
// the time come in through Observe and Evaluate, decisions go out as return
// values. Sampling from NVML, and telling kubelet (ListAndWatch), the scheduler
// (the inventory), events and metrics about a change, belong to the agent,
// which calls this package.
package adjuster

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/forecast"
)

// maxMissing is the share of missing samples in the window above which the
// adjuster holds: a forecast on mostly interpolated data is not one.
const maxMissing = 0.2

// Reason says why a GPU's slice count changed or held.
type Reason string

// Reasons.
const (
	ReasonDecrease     Reason = "ForecastAboveThreshold"
	ReasonIncrease     Reason = "ForecastBelowThreshold"
	ReasonInBand       Reason = "ForecastInBand"
	ReasonHysteresis   Reason = "WaitingForConsecutive"
	ReasonCooldown     Reason = "Cooldown"
	ReasonAtLimit      Reason = "AtLimit"
	ReasonWarmingUp    Reason = "WarmingUp"
	ReasonMissingData  Reason = "MissingSamples"
	ReasonForecastFail Reason = "ForecastFailed"
)

// Decision is the outcome of one evaluation of one GPU.
type Decision struct {
	GPU string
	// From and To are the slice counts before and after; equal when holding.
	From, To int
	// Forecast is the predicted utilization at the horizon (0–1), NaN if none.
	Forecast float64
	Reason   Reason
}

// Changed reports whether the slice count moves.
func (d Decision) Changed() bool { return d.From != d.To }

// gpuState is one GPU's history and decision state.
type gpuState struct {
	samples    []float64 // ring buffer; NaN marks a missing sample
	next       int
	filled     int
	slices     int
	inUse      int
	above      int // consecutive evaluations above DecreaseAbove
	below      int // consecutive evaluations below IncreaseBelow
	lastChange time.Time
	changed    bool
}

// Adjuster holds the per-GPU state. It is not safe for concurrent use; the
// agent drives it from one goroutine.
type Adjuster struct {
	cfg     config.FragmentConfig
	order   forecast.Order
	window  int // samples in the window
	horizon int // forecast steps to the horizon
	gpus    map[string]*gpuState
	scratch []float64
}

// New returns an adjuster for a validated fragment configuration.
func New(cfg config.FragmentConfig) (*Adjuster, error) {
	if cfg.SampleInterval.Duration <= 0 || cfg.Window.Duration < cfg.SampleInterval.Duration || cfg.Horizon.Duration <= 0 {
		return nil, fmt.Errorf("adjuster: fragments.sampleInterval %v, window %v and horizon %v must be positive, window ≥ interval",
			cfg.SampleInterval.Duration, cfg.Window.Duration, cfg.Horizon.Duration)
	}
	if cfg.MinSlices < 1 || cfg.MaxSlices < cfg.MinSlices || cfg.Consecutive < 1 {
		return nil, fmt.Errorf("adjuster: fragments.minSlices %d, maxSlices %d, consecutive %d out of range", cfg.MinSlices, cfg.MaxSlices, cfg.Consecutive)
	}
	a := &Adjuster{
		cfg:     cfg,
		order:   forecast.Order{P: cfg.ARIMA.P, D: cfg.ARIMA.D, Q: cfg.ARIMA.Q},
		window:  int(cfg.Window.Duration / cfg.SampleInterval.Duration),
		horizon: max(1, int(cfg.Horizon.Duration/cfg.SampleInterval.Duration)),
		gpus:    map[string]*gpuState{},
	}
	a.scratch = make([]float64, a.window)
	return a, nil
}

// Track starts (or updates) a GPU with its current slice count and how many
// of them are allocated. The count is clamped to the configured bounds.
func (a *Adjuster) Track(gpu string, slices, inUse int) {
	g := a.gpus[gpu]
	if g == nil {
		g = &gpuState{samples: make([]float64, a.window)}
		a.gpus[gpu] = g
	}
	g.slices = min(max(slices, a.cfg.MinSlices, inUse), a.cfg.MaxSlices)
	g.inUse = inUse
}

// Forget drops a GPU that disappeared.
func (a *Adjuster) Forget(gpu string) { delete(a.gpus, gpu) }

// SetInUse updates how many slices of a GPU are allocated.
func (a *Adjuster) SetInUse(gpu string, inUse int) {
	if g := a.gpus[gpu]; g != nil {
		g.inUse = inUse
	}
}

// Slices returns a GPU's current slice count.
func (a *Adjuster) Slices(gpu string) int {
	if g := a.gpus[gpu]; g != nil {
		return g.slices
	}
	return 0
}

// Observe records one utilization sample (0–1) of a GPU. A NaN, or a value
// outside [0, 1], records a missing sample (a sensor dropout).
func (a *Adjuster) Observe(gpu string, utilization float64) {
	g := a.gpus[gpu]
	if g == nil {
		return
	}
	if utilization < 0 || utilization > 1 {
		utilization = math.NaN()
	}
	g.samples[g.next] = utilization
	g.next = (g.next + 1) % len(g.samples)
	g.filled = min(g.filled+1, len(g.samples))
}

// Evaluate forecasts a GPU and decides its slice count at time now. A change
// is applied to the adjuster's state and returned; the caller makes it real.
func (a *Adjuster) Evaluate(gpu string, now time.Time) Decision {
	g := a.gpus[gpu]
	if g == nil {
		return Decision{GPU: gpu, Forecast: math.NaN(), Reason: ReasonForecastFail}
	}
	d := Decision{GPU: gpu, From: g.slices, To: g.slices, Forecast: math.NaN()}
	// Warm up on at least half a window: ARIMA on a handful of points is noise.
	if g.filled < a.window/2 {
		d.Reason = ReasonWarmingUp
		return d
	}
	series, missing := a.history(g)
	if float64(missing) > maxMissing*float64(len(series)) {
		d.Reason = ReasonMissingData
		g.above, g.below = 0, 0
		return d
	}
	pred, err := a.predict(series)
	if err != nil {
		d.Reason = ReasonForecastFail
		return d
	}
	d.Forecast = pred
	switch {
	case pred > a.cfg.DecreaseAbove:
		g.above++
		g.below = 0
	case pred < a.cfg.IncreaseBelow:
		g.below++
		g.above = 0
	default:
		g.above, g.below = 0, 0
		d.Reason = ReasonInBand
		return d
	}
	if g.above < a.cfg.Consecutive && g.below < a.cfg.Consecutive {
		d.Reason = ReasonHysteresis
		return d
	}
	if g.changed && now.Sub(g.lastChange) < a.cfg.Cooldown.Duration {
		d.Reason = ReasonCooldown
		return d
	}
	lowest := max(a.cfg.MinSlices, g.inUse)
	if g.above >= a.cfg.Consecutive {
		d.Reason = ReasonDecrease
		d.To = max(g.slices-1, lowest)
	} else {
		d.Reason = ReasonIncrease
		d.To = min(g.slices+1, a.cfg.MaxSlices)
	}
	if d.To == d.From {
		d.Reason = ReasonAtLimit
		return d
	}
	g.slices = d.To
	g.lastChange, g.changed = now, true
	g.above, g.below = 0, 0
	return d
}

// history returns the window in time order with missing samples filled by
// linear interpolation (ends carried), and how many were missing.
func (a *Adjuster) history(g *gpuState) ([]float64, int) {
	n := g.filled
	out := a.scratch[:n]
	start := (g.next - n + len(g.samples)) % len(g.samples)
	for i := range n {
		out[i] = g.samples[(start+i)%len(g.samples)]
	}
	missing := 0
	last := -1
	for i := range n {
		if math.IsNaN(out[i]) {
			missing++
			continue
		}
		if last >= 0 && i-last > 1 {
			for j := last + 1; j < i; j++ {
				f := float64(j-last) / float64(i-last)
				out[j] = out[last]*(1-f) + out[i]*f
			}
		} else if last < 0 {
			for j := range i {
				out[j] = out[i]
			}
		}
		last = i
	}
	if last < 0 {
		return out, n
	}
	for j := last + 1; j < n; j++ {
		out[j] = out[last]
	}
	return out, missing
}

// predict is the forecast at the horizon, clamped to [0, 1]. A series that
// does not vary forecasts its last value.
func (a *Adjuster) predict(series []float64) (float64, error) {
	m, err := forecast.Fit(series, a.order)
	var f forecast.Forecast
	switch {
	case errors.Is(err, forecast.ErrConstant), errors.Is(err, forecast.ErrNoModel):
		// No stochastic model: the series is flat, or follows an exact
		// pattern (the start of a ramp); its last value is the forecast.
		f = forecast.Naive(series, a.horizon)
	case err != nil:
		return 0, err
	default:
		if f, err = m.Forecast(a.horizon); err != nil {
			return 0, err
		}
	}
	return math.Min(math.Max(f.Mean[a.horizon-1], 0), 1), nil
}
