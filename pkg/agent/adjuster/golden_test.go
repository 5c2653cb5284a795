package adjuster

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

// update rewrites testdata's expected results with this run's: go test
// ./pkg/agent/adjuster -run Golden -update, then review the diff.
var update = flag.Bool("update", false, "rewrite testdata's expected results with this run's")

// TestGoldenDecisions replays utilization streams (testdata/decisions/*.txt)
// through the adjuster and prints its decisions, runs of equal ones folded
// into one line: a change of behaviour — a threshold, the hysteresis, the
// cooldown, the forecaster — shows as a diff of those files.
//
// Commands: config (fragment settings: window, sample, evaluate,
// consecutive, cooldown, min, max, decrease, increase), track gpu= slices=
// inuse=, inuse gpu= n=, and stream gpu= with one segment per input line:
// "<duration> const <u>", "<duration> ramp <from> <to>", "<duration> noise
// <mean> <amplitude>" or "<duration> missing". The stream is sampled every
// sample interval and evaluated every evaluate interval.
func TestGoldenDecisions(t *testing.T) {
	if *update {
		if err := flag.Set("rewrite", "true"); err != nil {
			t.Fatal(err)
		}
	}
	datadriven.Walk(t, "testdata/decisions", func(t *testing.T, path string) {
		var (
			a     *Adjuster
			cfg   config.FragmentConfig
			clock time.Time
			rng   *rand.Rand
		)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			arg := func(key, def string) string {
				for _, c := range d.CmdArgs {
					if c.Key == key && len(c.Vals) > 0 {
						return c.Vals[0]
					}
				}
				return def
			}
			num := func(key string, def float64) float64 {
				v, err := strconv.ParseFloat(arg(key, fmt.Sprint(def)), 64)
				if err != nil {
					t.Fatalf("%s: %s: %v", d.Pos, key, err)
				}
				return v
			}
			dur := func(key string, def time.Duration) config.Duration {
				v, err := time.ParseDuration(arg(key, def.String()))
				if err != nil {
					t.Fatalf("%s: %s: %v", d.Pos, key, err)
				}
				return config.Duration{Duration: v}
			}
			switch d.Cmd {
			case "config":
				cfg = config.Default().Fragments
				cfg.Window = dur("window", 20*time.Second)
				cfg.SampleInterval = dur("sample", 200*time.Millisecond)
				cfg.Horizon = dur("horizon", 10*time.Second)
				cfg.EvaluateEvery = dur("evaluate", time.Second)
				cfg.Cooldown = dur("cooldown", 5*time.Second)
				cfg.Consecutive = int(num("consecutive", 3))
				cfg.MinSlices = int(num("min", 1))
				cfg.MaxSlices = int(num("max", 8))
				cfg.DecreaseAbove = num("decrease", config.DefaultDecreaseAbove)
				cfg.IncreaseBelow = num("increase", config.DefaultIncreaseBelow)
				var err error
				if a, err = New(cfg); err != nil {
					return "error: " + err.Error()
				}
				clock = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
				rng = rand.New(rand.NewPCG(uint64(num("seed", 1)), 2))
				return ""
			case "track":
				a.Track(arg("gpu", "g0"), int(num("slices", 1)), int(num("inuse", 0)))
				return fmt.Sprintf("%s: %d slices", arg("gpu", "g0"), a.Slices(arg("gpu", "g0")))
			case "inuse":
				a.SetInUse(arg("gpu", "g0"), int(num("n", 0)))
				return ""
			case "stream":
				gpu := arg("gpu", "g0")
				var out decisionLog
				step, every := cfg.SampleInterval.Duration, cfg.EvaluateEvery.Duration
				start := clock
				nextEval := clock.Add(every)
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					f := strings.Fields(line)
					if len(f) < 2 {
						t.Fatalf("%s: segment %q: want <duration> <shape> …", d.Pos, line)
					}
					length, err := time.ParseDuration(f[0])
					if err != nil {
						t.Fatalf("%s: segment %q: %v", d.Pos, line, err)
					}
					vals := make([]float64, len(f)-2)
					for i := range vals {
						if vals[i], err = strconv.ParseFloat(f[i+2], 64); err != nil {
							t.Fatalf("%s: segment %q: %v", d.Pos, line, err)
						}
					}
					n := int(length / step)
					for i := range n {
						var u float64
						switch f[1] {
						case "const":
							u = vals[0]
						case "ramp":
							u = vals[0] + (vals[1]-vals[0])*float64(i)/float64(max(n-1, 1))
						case "noise":
							u = min(1, max(0, vals[0]+vals[1]*(2*rng.Float64()-1)))
						case "missing":
							u = math.NaN()
						default:
							t.Fatalf("%s: unknown shape %q", d.Pos, f[1])
						}
						clock = clock.Add(step)
						a.Observe(gpu, u)
						if !clock.Before(nextEval) {
							out.add(clock.Sub(start), a.Evaluate(gpu, clock))
							nextEval = nextEval.Add(every)
						}
					}
				}
				return out.String()
			}
			t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
			return ""
		})
	})
}

// decisionLog folds runs of evaluations with the same reason and slice
// counts into one line, with their time span and forecast range.
type decisionLog struct {
	lines []string
	run   struct {
		from, to   time.Duration
		n          int
		d          Decision
		fmin, fmax float64
		open       bool
		changed    bool
	}
}

func (l *decisionLog) add(at time.Duration, d Decision) {
	r := &l.run
	if r.open && !d.Changed() && !r.changed && d.Reason == r.d.Reason && d.From == r.d.From {
		r.to, r.n = at, r.n+1
		if !math.IsNaN(d.Forecast) {
			r.fmin, r.fmax = math.Min(r.fmin, d.Forecast), math.Max(r.fmax, d.Forecast)
		}
		return
	}
	l.flush()
	r.open, r.from, r.to, r.n, r.d, r.changed = true, at, at, 1, d, d.Changed()
	r.fmin, r.fmax = d.Forecast, d.Forecast
	if math.IsNaN(d.Forecast) {
		r.fmin, r.fmax = math.Inf(1), math.Inf(-1)
	}
}

func (l *decisionLog) flush() {
	r := &l.run
	if !r.open {
		return
	}
	span := fmt.Sprintf("%v", r.from)
	if r.n > 1 {
		span = fmt.Sprintf("%v–%v (%d)", r.from, r.to, r.n)
	}
	fc := "no forecast"
	switch {
	case math.IsInf(r.fmin, 1):
	case math.Abs(r.fmax-r.fmin) < 0.005:
		fc = fmt.Sprintf("forecast %.2f", r.fmin)
	default:
		fc = fmt.Sprintf("forecast %.2f–%.2f", r.fmin, r.fmax)
	}
	slices := fmt.Sprintf("%d slices", r.d.From)
	if r.changed {
		slices = fmt.Sprintf("%d → %d slices", r.d.From, r.d.To)
	}
	l.lines = append(l.lines, fmt.Sprintf("%s: %s, %s, %s", span, r.d.Reason, slices, fc))
	r.open = false
}

func (l *decisionLog) String() string {
	l.flush()
	return strings.Join(l.lines, "\n")
}
