package mps

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestTamperedLimitsAreRestored: a client lifts its GPU's limits through
// the control endpoint it must reach (issue 38: set_default_active_thread_percentage
// 100, set_default_device_pinned_mem_limit 0 81920M and the per-server
// set_* gave every tenant the whole GPU, and the agent never looked). The
// next check reads them back, reports exactly what changed, restores them,
// and the GPU counts as verified only once they read back right.
func TestTamperedLimitsAreRestored(t *testing.T) {
	if !usingFake {
		t.Skip("the real MPS daemon is checked by hack/gpu-isolation-check.sh on a GPU node")
	}
	var reported [][]Drift
	m := New(Config{Binary: controlBinary, Root: t.TempDir(), GPUs: []GPU{{UUID: "GPU-a", DefaultThreadPercentage: 100}},
		OnTamper: func(uuid string, d []Drift) {
			if uuid != "GPU-a" {
				t.Errorf("tamper reported on %s", uuid)
			}
			reported = append(reported, d)
		}})
	ctx := context.Background()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx) })
	if m.Verified("GPU-a") {
		t.Error("verified before any check")
	}
	if err := m.SetServerLimits(ctx, "GPU-a", gpu.MPSServerLimits{ThreadPercent: 30, MemoryMiB: 8192}); err != nil {
		t.Fatal(err)
	}
	m.Check(ctx)
	if !m.Verified("GPU-a") || len(reported) != 0 {
		t.Fatalf("untouched limits: verified %v, reported %v", m.Verified("GPU-a"), reported)
	}

	server := daemonPID(t, m, "GPU-a")
	for _, c := range []string{"set_default_active_thread_percentage 100", "set_default_device_pinned_mem_limit 0 81920M",
		fmt.Sprintf("set_active_thread_percentage %d 100", server), fmt.Sprintf("set_device_pinned_mem_limit %d 0 80G", server)} {
		if out, err := m.Control(ctx, "GPU-a", c); err != nil {
			t.Fatalf("%s: %v: %s", c, err, out)
		}
	}
	start := time.Now()
	m.Check(ctx)
	took := time.Since(start)
	want := [][]Drift{{
		{Limit: "get_default_active_thread_percentage", Want: "30 %", Got: "100 %"},
		{Limit: "get_default_device_pinned_mem_limit 0", Want: "8192 MiB", Got: "81920 MiB"},
		{Limit: fmt.Sprintf("get_active_thread_percentage %d", server), Want: "30 %", Got: "100 %"},
		{Limit: fmt.Sprintf("get_device_pinned_mem_limit %d 0", server), Want: "8192 MiB", Got: "81920 MiB"},
	}}
	if d := cmp.Diff(want, reported); d != "" {
		t.Errorf("reported changes (-want +got):\n%s", d)
	}
	if drift, err := m.Verify(ctx, "GPU-a"); err != nil || len(drift) != 0 {
		t.Errorf("after the check: drift %v, %v", drift, err)
	}
	if !m.Verified("GPU-a") {
		t.Error("restored limits not counted as verified")
	}
	t.Logf("one check found and restored 4 changed limits in %v", took)

	// A daemon that answers nonsense is not verified, and Ensure says so.
	m.cfg.Binary = "/bin/echo"
	if m.Ensure(ctx, "GPU-a") || m.Verified("GPU-a") {
		t.Error("limits that cannot be read back count as verified")
	}
}

func TestParseLimits(t *testing.T) {
	for _, tt := range []struct {
		in      string
		percent int64
		mem     int64
		bad     string // "percent", "mem" or "both"
	}{
		{in: "30", percent: 30, mem: 30},
		{in: "30.0", percent: 30, mem: 30},
		{in: " 100.0\n", percent: 100, mem: 100},
		{in: "8192M", bad: "percent", mem: 8192},
		{in: "8G", bad: "percent", mem: 8192},
		{in: "1.5G", bad: "percent", mem: 1536},
		{in: "8192MB", bad: "percent", mem: 8192},
		{in: "2048K", bad: "percent", mem: 2},
		{in: "101", bad: "percent", mem: 101},
		{in: "", bad: "both"},
		{in: "Invalid server PID 12", bad: "both"},
		{in: "8X", bad: "both"},
		{in: "-1", bad: "both"},
	} {
		p, perr := ParsePercent(tt.in)
		m, merr := ParseMemoryMiB(tt.in)
		badP, badM := tt.bad == "percent" || tt.bad == "both", tt.bad == "mem" || tt.bad == "both"
		if (perr != nil) != badP || !badP && p != tt.percent {
			t.Errorf("ParsePercent(%q) = %d, %v", tt.in, p, perr)
		}
		if (merr != nil) != badM || !badM && m != tt.mem {
			t.Errorf("ParseMemoryMiB(%q) = %d, %v", tt.in, m, merr)
		}
		if perr != nil && !strings.Contains(perr.Error(), "percentage") {
			t.Errorf("ParsePercent(%q): error %q names no percentage", tt.in, perr)
		}
	}
}
