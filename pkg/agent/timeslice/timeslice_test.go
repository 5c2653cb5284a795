package timeslice

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

func lengths(compute, io time.Duration) config.TimeSliceConfig {
	return config.TimeSliceConfig{ComputeBound: config.Duration{Duration: compute}, IOBound: config.Duration{Duration: io}}
}

func TestClassOf(t *testing.T) {
	for _, tc := range []struct {
		name        string
		cfg         config.TimeSliceConfig
		compute, io Class
	}{
		{"defaults: 100 ms compute, 50 ms IO", config.Default().TimeSlice, Long, Medium},
		{"IO-bound longer", lengths(20*time.Millisecond, 40*time.Millisecond), Medium, Long},
		{"equal", lengths(50*time.Millisecond, 50*time.Millisecond), Long, Long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ClassOf(tc.cfg, false); got != tc.compute {
				t.Errorf("compute-bound: %v, want %v", got, tc.compute)
			}
			if got := ClassOf(tc.cfg, true); got != tc.io {
				t.Errorf("IO-bound: %v, want %v", got, tc.io)
			}
		})
	}
}

// fakeSMI writes a stand-in nvidia-smi that appends its arguments to a log
// and exits with code (printing msg when non-zero).
func fakeSMI(t *testing.T, code int, msg string) (path, log string) {
	t.Helper()
	dir := t.TempDir()
	path, log = filepath.Join(dir, "nvidia-smi"), filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$@\" >> " + log + "\n"
	if code != 0 {
		script += "echo '" + msg + "'\nexit " + string(rune('0'+code)) + "\n"
	}
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, log
}

func calls(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestNvidiaSMICommandLine(t *testing.T) {
	path, log := fakeSMI(t, 0, "")
	smi, err := Find(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := smi.SetTimeslice(context.Background(), "GPU-abc", Medium); err != nil {
		t.Fatal(err)
	}
	if got := calls(t, log); len(got) != 1 || got[0] != "compute-policy -i GPU-abc --set-timeslice 2" {
		t.Fatalf("nvidia-smi was run with %q", got)
	}
}

func TestNvidiaSMIFailureSaysWhy(t *testing.T) {
	path, _ := fakeSMI(t, 3, "Setting timeslice is not supported for GPU 00000000:07:00.0.")
	err := NvidiaSMI{Path: path}.SetTimeslice(context.Background(), "GPU-abc", Long)
	if err == nil || !strings.Contains(err.Error(), "not supported for GPU") || !strings.Contains(err.Error(), "--set-timeslice 3") {
		t.Fatalf("error = %v; want the command and nvidia-smi's own words", err)
	}
}

func TestFindMissing(t *testing.T) {
	_, err := Find(filepath.Join(t.TempDir(), "nvidia-smi"))
	if !errors.Is(err, ErrNoNvidiaSMI) || !strings.Contains(err.Error(), "NVIDIA_DRIVER_CAPABILITIES") {
		t.Fatalf("Find = %v", err)
	}
}

// flaky fails its first n calls.
type flaky struct {
	Recorder
	n, calls int
}

func (f *flaky) SetTimeslice(ctx context.Context, uuid string, c Class) error {
	f.calls++
	if f.calls <= f.n {
		return errors.New("driver busy")
	}
	return f.Recorder.SetTimeslice(ctx, uuid, c)
}

func TestManagerAppliesChangesOnlyAndRetriesLater(t *testing.T) {
	ctx, t0 := context.Background(), time.Now()
	s := &flaky{n: 1}
	m := NewManager(s, time.Minute)
	gpus := []string{"A", "B"}

	// A fails once; B is applied.
	ch := m.Apply(ctx, gpus, map[string]Class{"A": Long, "B": Medium}, t0)
	if len(ch) != 2 || ch[0].Err == nil || ch[1].Err != nil || !ch[1].First || ch[1].To != Medium {
		t.Fatalf("first pass: %+v", ch)
	}
	// Nothing changed and A's retry is not due: no call at all.
	if ch := m.Apply(ctx, gpus, map[string]Class{"A": Long, "B": Medium}, t0.Add(time.Second)); len(ch) != 0 || s.calls != 2 {
		t.Fatalf("second pass: %+v after %d calls", ch, s.calls)
	}
	// A minute on, A is retried and succeeds.
	ch = m.Apply(ctx, gpus, map[string]Class{"A": Long, "B": Medium}, t0.Add(time.Minute))
	if len(ch) != 1 || ch[0].GPU != "A" || ch[0].Err != nil {
		t.Fatalf("retry: %+v", ch)
	}
	if c, _ := s.Get("A"); c != Long {
		t.Fatalf("A is %v", c)
	}
	// B's tenants change: one call, from Medium to Long.
	ch = m.Apply(ctx, gpus, map[string]Class{"A": Long, "B": Long}, t0.Add(2*time.Minute))
	if len(ch) != 1 || ch[0].GPU != "B" || ch[0].From != Medium || ch[0].To != Long || ch[0].First {
		t.Fatalf("change: %+v", ch)
	}
	if c, ok := m.Applied("B"); !ok || c != Long {
		t.Fatalf("Applied(B) = %v, %v", c, ok)
	}
}

func TestRecorderFails(t *testing.T) {
	var r Recorder
	refused := errors.New("nvidia-smi: not supported")
	r.Fail(refused)
	if err := r.SetTimeslice(context.Background(), "GPU-a", 2); !errors.Is(err, refused) {
		t.Fatalf("SetTimeslice while failing: %v, want %v", err, refused)
	}
	if _, ok := r.Get("GPU-a"); ok {
		t.Error("a failed setting was recorded")
	}
	r.Fail(nil)
	if err := r.SetTimeslice(context.Background(), "GPU-a", 2); err != nil {
		t.Fatal(err)
	}
	if c, ok := r.Get("GPU-a"); !ok || c != 2 {
		t.Errorf("after Fail(nil): %v %v, want class 2 recorded", c, ok)
	}
}
