package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDefaultsAreTheProductionNumbers(t *testing.T) {
	c := Default()
	if err := Validate(c); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	want := &Configuration{
		APIVersion: "tessera.dev/v1alpha1",
		Kind:       "TesseraConfiguration",
		Allocator: AllocatorConfig{
			Policy:                  PolicyTessera,
			MemoryOversubscription:  1.5,
			ComputeOversubscription: 1.0,
			MinSliceMiB:             MinSlice{Training: 8192, Inference: 4096},
			WorkloadCoverage:        0.95,
		},
		TimeSlice: TimeSliceConfig{ComputeBound: Duration{100 * time.Millisecond}, IOBound: Duration{50 * time.Millisecond}},
		Fragments: FragmentConfig{SampleInterval: Duration{500 * time.Millisecond}, DecreaseAbove: 0.85, IncreaseBelow: 0.40,
			Window: Duration{5 * time.Minute}, Horizon: Duration{5 * time.Minute}, EvaluateEvery: Duration{10 * time.Second},
			Consecutive: 12, Cooldown: Duration{2 * time.Minute}, MinSlices: 1, MaxSlices: 8, ARIMA: ARIMAOrder{P: 5, D: 1}},
		Stall:      StallConfig{Window: Duration{5 * time.Minute}, Threshold: 0.15},
		Health:     HealthConfig{IgnoredXids: []uint64{13, 31, 43, 45, 68, 109}, QuietPeriod: Duration{5 * time.Minute}},
		Preemption: PreemptionConfig{GracePeriod: Duration{30 * time.Second}, RecordRetention: 100, ReclaimTimeout: Duration{2 * time.Minute}},
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("Default() (-want +got):\n%s", diff)
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		wantErr   []string // each must appear
		wantField string   // with errors.As, the first FieldError's field
		check     func(*testing.T, *Configuration)
	}{
		{
			name: "minimal",
			yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\n",
			check: func(t *testing.T, c *Configuration) {
				if c.Allocator.Policy != DefaultPolicy {
					t.Errorf("policy = %q, want the default", c.Allocator.Policy)
				}
			},
		},
		{
			name: "overrides",
			yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  policy: fgd\n  memoryOversubscription: 1.2\ntimeSlice:\n  computeBound: 200ms\n",
			check: func(t *testing.T, c *Configuration) {
				if c.Allocator.Policy != PolicyFGD || c.Allocator.MemoryOversubscription != 1.2 || c.TimeSlice.ComputeBound.Duration != 200*time.Millisecond {
					t.Errorf("overrides not applied: %+v", c)
				}
			},
		},
		{
			name: "no XID ignored",
			yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nhealth:\n  ignoredXids: []\n  quietPeriod: 1m\n",
			check: func(t *testing.T, c *Configuration) {
				if c.Health.IgnoredXids == nil || len(c.Health.IgnoredXids) != 0 || c.Health.QuietPeriod.Duration != time.Minute {
					t.Errorf("health = %+v, want an empty ignore list kept empty and 1m", c.Health)
				}
			},
		},
		{name: "negative quiet period", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nhealth:\n  quietPeriod: -1s\n",
			wantErr: []string{"health.quietPeriod: invalid value -1s"}, wantField: "health.quietPeriod"},
		{name: "negative grace period", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\npreemption:\n  gracePeriod: -5s\n",
			wantErr: []string{"preemption.gracePeriod: invalid value -5s"}, wantField: "preemption.gracePeriod"},
		{name: "no scene records kept", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\npreemption:\n  recordRetention: -1\n",
			wantErr: []string{"preemption.recordRetention"}, wantField: "preemption.recordRetention"},
		{name: "oversubscription above 1.5", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  memoryOversubscription: 2.0\n",
			wantErr: []string{"allocator.memoryOversubscription: invalid value 2"}, wantField: "allocator.memoryOversubscription"},
		{name: "oversubscription below 1", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  memoryOversubscription: 0.5\n",
			wantErr: []string{"must be between 1.0 and 1.5"}, wantField: "allocator.memoryOversubscription"},
		{name: "compute oversubscription", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  computeOversubscription: 1.1\n",
			wantErr: []string{"allocator.computeOversubscription", "never oversubscribed"}, wantField: "allocator.computeOversubscription"},
		{name: "negative minimum", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  minSliceMiB:\n    training: -1\n",
			wantErr: []string{"allocator.minSliceMiB.training: invalid value -1"}, wantField: "allocator.minSliceMiB.training"},
		{name: "unknown policy", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  policy: firstfit\n",
			wantErr: []string{"allocator.policy: invalid value firstfit: want one of binpack, spread, fgd, tessera"}, wantField: "allocator.policy"},
		{name: "thresholds that would flap", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nfragments:\n  decreaseAbove: 0.5\n  increaseBelow: 0.6\n",
			wantErr: []string{"fragments.increaseBelow", "flap"}, wantField: "fragments.increaseBelow"},
		{name: "max below min", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nfragments:\n  minSlices: 4\n  maxSlices: 2\n",
			wantErr: []string{"fragments.maxSlices: invalid value 2: must be at least fragments.minSlices (4)"}, wantField: "fragments.maxSlices"},
		{name: "arima order", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nfragments:\n  arima: {p: 9, d: 1, q: 0}\n",
			wantErr: []string{"fragments.arima: invalid value (9,1,0)"}, wantField: "fragments.arima"},
		{name: "window too short", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nfragments:\n  window: 10s\n",
			wantErr: []string{"fragments.window: invalid value 10s: holds 20 samples"}, wantField: "fragments.window"},
		{name: "negative duration", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\ntimeSlice:\n  ioBound: -5ms\n",
			wantErr: []string{"timeSlice.ioBound: invalid value -5ms"}, wantField: "timeSlice.ioBound"},
		{name: "misspelt field", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  polcy: fgd\n",
			wantErr: []string{`unknown field "polcy"`}},
		{name: "bad duration", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nstall:\n  window: five minutes\n",
			wantErr: []string{"five minutes"}},
		{name: "wrong version", yaml: "apiVersion: tessera.dev/v2\nkind: TesseraConfiguration\n",
			wantErr: []string{"apiVersion: invalid value tessera.dev/v2"}, wantField: "apiVersion"},
		{name: "two problems at once", yaml: "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  policy: x\n  memoryOversubscription: 9\n",
			wantErr: []string{"allocator.policy", "allocator.memoryOversubscription"}, wantField: "allocator.policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load([]byte(tt.yaml))
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Load() = %v", err)
				}
				tt.check(t, c)
				return
			}
			if err == nil {
				t.Fatalf("Load() succeeded, want an error containing %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if tt.wantField != "" {
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Field != tt.wantField {
					t.Errorf("errors.As FieldError = %v, want field %q", fe, tt.wantField)
				}
			}
		})
	}
}

// TestZeroIsAValue: a field written as 0 is that value — refused by its name
// where 0 is wrong, kept where it means something — and a field left out or
// written as null takes its default. Before, both were "not given": a
// recordRetention of 0 silently became 100 and a cooldown of 0s two minutes.
func TestZeroIsAValue(t *testing.T) {
	const head = "apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\n"
	for _, c := range []struct{ yaml, field string }{
		{"preemption: {recordRetention: 0}", "preemption.recordRetention"},
		{"preemption: {gracePeriod: 0s}", "preemption.gracePeriod"},
		{"preemption: {reclaimTimeout: 0s}", "preemption.reclaimTimeout"},
		{"allocator: {memoryOversubscription: 0}", "allocator.memoryOversubscription"},
		{"allocator: {computeOversubscription: 0}", "allocator.computeOversubscription"},
		{"allocator: {workloadCoverage: 0}", "allocator.workloadCoverage"},
		{"allocator: {minSliceMiB: {training: 0}}", "allocator.minSliceMiB.training"},
		{"allocator: {minSliceMiB: {inference: 0}}", "allocator.minSliceMiB.inference"},
		{"allocator: {policy: ''}", "allocator.policy"},
		{"timeSlice: {computeBound: 0s}", "timeSlice.computeBound"},
		{"timeSlice: {ioBound: 0s}", "timeSlice.ioBound"},
		{"fragments: {sampleInterval: 0s}", "fragments.sampleInterval"},
		{"fragments: {decreaseAbove: 0}", "fragments.decreaseAbove"},
		{"fragments: {increaseBelow: 0}", "fragments.increaseBelow"},
		{"fragments: {window: 0s}", "fragments.window"},
		{"fragments: {horizon: 0s}", "fragments.horizon"},
		{"fragments: {evaluateEvery: 0s}", "fragments.evaluateEvery"},
		{"fragments: {consecutive: 0}", "fragments.consecutive"},
		{"fragments: {minSlices: 0}", "fragments.minSlices"},
		{"fragments: {maxSlices: 0}", "fragments.maxSlices"},
		{"stall: {window: 0s}", "stall.window"},
		{"stall: {threshold: 0}", "stall.threshold"},
		{"health: {quietPeriod: 0s}", "health.quietPeriod"},
		{"apiVersion: ''", "apiVersion"},
	} {
		t.Run(c.yaml, func(t *testing.T) {
			_, err := Load([]byte(head + c.yaml + "\n"))
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Fatalf("Load = %v, want a FieldError naming %s", err, c.field)
			}
		})
	}
	for _, c := range []struct {
		yaml  string
		check func(*Configuration) bool
	}{
		{"fragments: {cooldown: 0s}", func(c *Configuration) bool { return c.Fragments.Cooldown.Duration == 0 }},
		{"fragments: {arima: {p: 0, d: 0, q: 0}}", func(c *Configuration) bool { return c.Fragments.ARIMA == ARIMAOrder{} }},
		{"fragments: {arima: {p: 2}}", func(c *Configuration) bool { return c.Fragments.ARIMA == ARIMAOrder{P: 2, D: 1} }},
		{"fragments: {arima: {d: 0}}", func(c *Configuration) bool { return c.Fragments.ARIMA == ARIMAOrder{P: 5} }},
		{"health: {ignoredXids: []}", func(c *Configuration) bool { return c.Health.IgnoredXids != nil && len(c.Health.IgnoredXids) == 0 }},
		{"preemption: {recordRetention: null}", func(c *Configuration) bool { return c.Preemption.RecordRetention == DefaultRecordRetention }},
		{"preemption: null", func(c *Configuration) bool { return c.Preemption.RecordRetention == DefaultRecordRetention }},
		{"fragments: {minSlices: 2}", func(c *Configuration) bool {
			return c.Fragments.MinSlices == 2 && c.Fragments.MaxSlices == DefaultMaxSlices && c.Fragments.Cooldown.Duration == DefaultCooldown
		}},
	} {
		t.Run(c.yaml, func(t *testing.T) {
			got, err := Load([]byte(head + c.yaml + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(got) {
				t.Fatalf("got %+v", got)
			}
		})
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte("apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\n"))
	f.Add([]byte("allocator: {policy: fgd, memoryOversubscription: 1.5}"))
	f.Add([]byte("timeSlice: {computeBound: 1h}"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Load(b)
		if err != nil {
			return
		}
		if err := Validate(c); err != nil {
			t.Fatalf("Load accepted a config that does not validate: %v", err)
		}
	})
}
