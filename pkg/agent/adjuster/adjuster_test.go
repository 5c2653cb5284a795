package adjuster

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

const step = 500 * time.Millisecond

// trace gives the utilization at sample i (NaN for a dropout).
type trace func(i int, rng *rand.Rand) float64

func noisy(level float64) trace {
	return func(_ int, rng *rand.Rand) float64 { return clamp(level + 0.02*rng.NormFloat64()) }
}

func clamp(v float64) float64 { return math.Min(math.Max(v, 0), 1) }

// run feeds samples for the given duration, evaluates every EvaluateEvery and
// returns every decision that changed the slice count, plus all forecasts.
func run(t *testing.T, cfg config.FragmentConfig, tr trace, d time.Duration, slices, inUse int) (changes []Decision, all []Decision) {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.Track("gpu0", slices, inUse)
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	every := int(cfg.EvaluateEvery.Duration / step)
	for i := range int(d / step) {
		a.Observe("gpu0", tr(i, rng))
		if (i+1)%every == 0 {
			dec := a.Evaluate("gpu0", start.Add(time.Duration(i)*step))
			all = append(all, dec)
			if dec.Changed() {
				changes = append(changes, dec)
			}
		}
	}
	return changes, all
}

func defaults() config.FragmentConfig { return config.Default().Fragments }

func counts(changes []Decision) (up, down int) {
	for _, c := range changes {
		if c.To > c.From {
			up++
		} else {
			down++
		}
	}
	return up, down
}

func TestDecisionsOnSyntheticTraces(t *testing.T) {
	cfg := defaults()
	tests := []struct {
		name          string
		trace         trace
		slices, inUse int
		wantUp        int
		wantDown      int
		wantFinal     int
	}{
		// 20 minutes at 92 %: one step down per 2-minute cooldown until the minimum.
		{name: "steady high", trace: noisy(0.92), slices: 4, wantDown: 3, wantFinal: 1},
		{name: "steady high, two slices in use", trace: noisy(0.92), slices: 4, inUse: 2, wantDown: 2, wantFinal: 2},
		{name: "steady low", trace: noisy(0.20), slices: 4, wantUp: 4, wantFinal: 8},
		{name: "in band", trace: noisy(0.60), slices: 4, wantFinal: 4},
		{name: "diurnal inside the band", slices: 4, wantFinal: 4, trace: func(i int, rng *rand.Rand) float64 {
			return clamp(0.62 + 0.15*math.Sin(2*math.Pi*float64(i)/1200) + 0.02*rng.NormFloat64())
		}},
		{name: "spikes on a mid base", slices: 4, wantFinal: 4, trace: func(i int, rng *rand.Rand) float64 {
			if rng.IntN(20) == 0 {
				return 1
			}
			return clamp(0.5 + 0.02*rng.NormFloat64())
		}},
		{name: "ten percent dropouts", slices: 4, wantDown: 3, wantFinal: 1, trace: func(i int, rng *rand.Rand) float64 {
			if rng.IntN(10) == 0 {
				return math.NaN()
			}
			return clamp(0.92 + 0.02*rng.NormFloat64())
		}},
		{name: "forty percent dropouts hold", slices: 4, wantFinal: 4, trace: func(i int, rng *rand.Rand) float64 {
			if rng.IntN(10) < 4 {
				return math.NaN()
			}
			return clamp(0.92 + 0.02*rng.NormFloat64())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changes, _ := run(t, cfg, tt.trace, 20*time.Minute, tt.slices, tt.inUse)
			up, down := counts(changes)
			final := tt.slices
			if len(changes) > 0 {
				final = changes[len(changes)-1].To
			}
			if up != tt.wantUp || down != tt.wantDown || final != tt.wantFinal {
				t.Errorf("%d up, %d down, final %d; want %d up, %d down, final %d (%+v)", up, down, final, tt.wantUp, tt.wantDown, tt.wantFinal, changes)
			}
			for _, c := range changes {
				if c.To < max(cfg.MinSlices, tt.inUse) || c.To > cfg.MaxSlices {
					t.Errorf("change to %d slices, outside [%d, %d]", c.To, max(cfg.MinSlices, tt.inUse), cfg.MaxSlices)
				}
			}
		})
	}
}

// TestRampChangesDirectionOnce: utilization climbing from 10 % to 95 % over
// 20 minutes first adds slices, then removes them, and never reverses back.
func TestRampChangesDirectionOnce(t *testing.T) {
	n := int(30 * time.Minute / step)
	ramp := func(i int, rng *rand.Rand) float64 {
		return clamp(0.10 + 0.85*math.Min(float64(i)/float64(n*2/3), 1) + 0.02*rng.NormFloat64())
	}
	changes, all := run(t, defaults(), ramp, 30*time.Minute, 4, 0)
	up, down := counts(changes)
	if up == 0 || down == 0 {
		t.Fatalf("%d up, %d down on a ramp: %+v", up, down, changes)
	}
	reversals := 0
	for i := 1; i < len(changes); i++ {
		if (changes[i].To > changes[i].From) != (changes[i-1].To > changes[i-1].From) {
			reversals++
		}
	}
	if reversals != 1 {
		t.Errorf("%d reversals, want 1: %+v", reversals, changes)
	}
	for _, d := range all {
		if d.Changed() && d.To < d.From && d.Forecast <= 0.85 {
			t.Errorf("decreased on forecast %.2f", d.Forecast)
		}
	}
}

// TestNoFlapping: a load that swings between 30 % and 90 % every minute never
// moves the slices more than once per cooldown, and never back and forth.
func TestNoFlapping(t *testing.T) {
	cfg := defaults()
	square := func(i int, rng *rand.Rand) float64 {
		if (i/120)%2 == 0 {
			return clamp(0.3 + 0.02*rng.NormFloat64())
		}
		return clamp(0.9 + 0.02*rng.NormFloat64())
	}
	changes, _ := run(t, cfg, square, 30*time.Minute, 4, 0)
	for i := 1; i < len(changes); i++ {
		if (changes[i].To > changes[i].From) != (changes[i-1].To > changes[i-1].From) {
			t.Errorf("flapped: %+v then %+v", changes[i-1], changes[i])
		}
	}
	if len(changes) > int(30*time.Minute/cfg.Cooldown.Duration) {
		t.Errorf("%d changes in 30 minutes with a %v cooldown", len(changes), cfg.Cooldown.Duration)
	}
}

// TestForecastErrorBound: a short-horizon forecast tracks steady, diurnal and
// ramping loads within 5 points of utilization on average.
func TestForecastErrorBound(t *testing.T) {
	cfg := defaults()
	cfg.Horizon = config.Duration{Duration: 5 * time.Second} // 10 steps
	for name, tr := range map[string]trace{
		"steady": noisy(0.7),
		"diurnal": func(i int, rng *rand.Rand) float64 {
			return clamp(0.55 + 0.3*math.Sin(2*math.Pi*float64(i)/1200) + 0.02*rng.NormFloat64())
		},
		"ramp": func(i int, rng *rand.Rand) float64 { return clamp(0.2 + 0.7*float64(i)/4800 + 0.02*rng.NormFloat64()) },
	} {
		t.Run(name, func(t *testing.T) {
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			a.Track("g", 4, 0)
			rng := rand.New(rand.NewPCG(9, 9))
			values := make([]float64, 4800)
			for i := range values {
				values[i] = tr(i, rng)
			}
			var sumErr float64
			var n int
			for i, v := range values {
				a.Observe("g", v)
				if (i+1)%20 == 0 && i+10 < len(values) {
					d := a.Evaluate("g", time.Unix(int64(i), 0))
					if math.IsNaN(d.Forecast) {
						continue
					}
					sumErr += math.Abs(d.Forecast - values[i+10])
					n++
				}
			}
			if n < 100 {
				t.Fatalf("only %d forecasts", n)
			}
			if mae := sumErr / float64(n); mae > 0.05 {
				t.Errorf("mean absolute error %.3f over %d forecasts, bound 0.05", mae, n)
			} else {
				t.Logf("mean absolute error %.4f over %d forecasts", mae, n)
			}
		})
	}
}

func TestWarmUpAndConstant(t *testing.T) {
	a, err := New(defaults())
	if err != nil {
		t.Fatal(err)
	}
	a.Track("g", 4, 0)
	for range 100 {
		a.Observe("g", 0.95)
	}
	if d := a.Evaluate("g", time.Now()); d.Reason != ReasonWarmingUp || d.Changed() {
		t.Fatalf("after 100 samples: %+v", d)
	}
	for range 500 {
		a.Observe("g", 0.95) // a constant series forecasts its last value
	}
	d := a.Evaluate("g", time.Now())
	if d.Forecast != 0.95 || d.Reason != ReasonHysteresis {
		t.Fatalf("constant 0.95: %+v", d)
	}
	if d := a.Evaluate("unknown", time.Now()); d.Changed() {
		t.Fatalf("unknown GPU changed: %+v", d)
	}
}

// BenchmarkAdjuster8GPUs is the agent's steady cost for 8 GPUs: 20 samples
// each (10 s at 500 ms) and one evaluation each, per op. Divide by 10 s for
// the share of a core.
func BenchmarkAdjuster8GPUs(b *testing.B) {
	a, err := New(defaults())
	if err != nil {
		b.Fatal(err)
	}
	gpus := []string{"g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"}
	rng := rand.New(rand.NewPCG(1, 1))
	for _, g := range gpus {
		a.Track(g, 4, 0)
		for range 600 {
			a.Observe(g, clamp(0.6+0.05*rng.NormFloat64()))
		}
	}
	now := time.Unix(0, 0)
	b.ReportAllocs()
	for b.Loop() {
		for _, g := range gpus {
			for range 20 {
				a.Observe(g, clamp(0.6+0.05*rng.NormFloat64()))
			}
			a.Evaluate(g, now)
		}
		now = now.Add(10 * time.Second)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(10*time.Second)*100, "%core")
}
