package health

import (
	"reflect"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/pkg/nvml"
)

func xid(uuid string, code uint64) nvml.Event {
	return nvml.Event{UUID: uuid, Type: gonvml.EventTypeXidCriticalError, Xid: code}
}

func TestFaultsTakeAGPUOutAndQuietBringsItBack(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	quiet := 5 * time.Minute
	type step struct {
		at     time.Duration
		event  *nvml.Event
		lost   string
		answer string
		// want: the GPUs out of service right after the step.
		want []string
	}
	ev := func(e nvml.Event) *nvml.Event { return &e }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"application XIDs are ignored", []step{
			{at: 0, event: ev(xid("GPU-a", 13))},
			{at: time.Second, event: ev(xid("GPU-a", 31))},
			{at: 2 * time.Second, event: ev(xid("GPU-a", 109))},
		}},
		{"a critical XID takes the GPU out at once, alone", []step{
			{at: 0, event: ev(xid("GPU-a", 79)), want: []string{"GPU-a"}},
			{at: 4 * time.Minute, want: []string{"GPU-a"}},
			{at: 5 * time.Minute, want: nil},
		}},
		{"a second fault restarts the quiet period", []step{
			{at: 0, event: ev(xid("GPU-b", 48)), want: []string{"GPU-b"}},
			{at: 4 * time.Minute, event: ev(xid("GPU-b", 48)), want: []string{"GPU-b"}},
			{at: 8 * time.Minute, want: []string{"GPU-b"}},
			{at: 9 * time.Minute, want: nil},
		}},
		{"double-bit ECC counts; single-bit does not", []step{
			{at: 0, event: &nvml.Event{UUID: "GPU-c", Type: gonvml.EventTypeSingleBitEccError}},
			{at: time.Second, event: &nvml.Event{UUID: "GPU-c", Type: gonvml.EventTypeDoubleBitEccError}, want: []string{"GPU-c"}},
		}},
		{"a lost GPU stays out until it answers, then waits out the quiet period", []step{
			{at: 0, lost: "GPU-d", want: []string{"GPU-d"}},
			{at: time.Hour, want: []string{"GPU-d"}},
			{at: time.Hour, answer: "GPU-d", want: nil}, // lost an hour ago: quiet already
			{at: 2 * time.Hour, lost: "GPU-d", want: []string{"GPU-d"}},
			{at: 2*time.Hour + time.Minute, answer: "GPU-d", want: []string{"GPU-d"}},
			{at: 2*time.Hour + 5*time.Minute, want: nil},
		}},
		{"an event for no GPU faults them all", []step{
			{at: 0, event: ev(xid("GPU-g", 79)), want: []string{"GPU-g"}}, // known from an earlier fault
			{at: time.Second, event: ev(xid("", 79)), want: []string{"GPU-e", "GPU-f", "GPU-g"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(DefaultIgnoredXids, quiet)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				switch {
				case s.event != nil:
					tr.Observe(*s.event, now, "GPU-e", "GPU-f") // the node's GPUs
				case s.lost != "":
					tr.Lost(s.lost, now)
				case s.answer != "":
					tr.Answering(s.answer)
				}
				if got := tr.Unhealthy(now); !reflect.DeepEqual(got, s.want) {
					t.Fatalf("step %d (+%v): unhealthy %v, want %v", i, s.at, got, s.want)
				}
			}
		})
	}
}

func TestHealthySaysWhyAndUntilWhen(t *testing.T) {
	t0 := time.Now()
	tr := New(nil, time.Minute)
	if !tr.Observe(xid("GPU-a", 13), t0) {
		t.Fatal("with no ignore list, XID 13 must count")
	}
	ok, reason, until := tr.Healthy("GPU-a", t0.Add(time.Second))
	if ok || !strings.Contains(reason, "XID 13") || !until.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Healthy = %v, %q, %v", ok, reason, until)
	}
	if ok, _, _ := tr.Healthy("GPU-never-seen", t0); !ok {
		t.Fatal("a GPU with no fault is healthy")
	}
}
