package mps

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestServerLimitsHoldEveryClient: the server limits the agent sets reach
// the daemon's defaults and its running server, and come back after the
// daemon is restarted; what a client that clears its own variables gets is
// the server's limit, the largest tenant's grant, never the whole GPU.
func TestServerLimitsHoldEveryClient(t *testing.T) {
	if !usingFake {
		t.Skip("the real MPS daemon is checked by hack/gpu-isolation-check.sh on a GPU node")
	}
	m := New(Config{Binary: controlBinary, Root: t.TempDir(), GPUs: []GPU{{UUID: "GPU-a", DefaultThreadPercentage: 100}}})
	ctx := context.Background()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx) })
	tenants := []gpu.GPUGrant{{MemoryMiB: 8192, CoresPerMille: 300}, {MemoryMiB: 20480, CoresPerMille: 700}}
	l := gpu.MPSServerLimitsFor(tenants)
	if err := m.SetServerLimits(ctx, "GPU-a", l); err != nil {
		t.Fatal(err)
	}
	server := daemonPID(t, m, "GPU-a")
	check := func(when string) {
		t.Helper()
		pid := daemonPID(t, m, "GPU-a")
		for cmd, want := range map[string]string{
			"get_default_active_thread_percentage":               "70",
			"get_default_device_pinned_mem_limit 0":              "20480M",
			fmt.Sprintf("get_active_thread_percentage %d", pid):  "70",
			fmt.Sprintf("get_device_pinned_mem_limit %d 0", pid): "20480M",
		} {
			if out, err := m.Control(ctx, "GPU-a", cmd); err != nil || out != want {
				t.Errorf("%s: %s = %q, %v; want %q", when, cmd, out, err, want)
			}
		}
	}
	check("after SetServerLimits")
	log := strings.Join(controlLog(t, m, "GPU-a"), "|")
	for _, want := range []string{"set_default_active_thread_percentage 70", "set_default_device_pinned_mem_limit 0 20480M",
		fmt.Sprintf("set_active_thread_percentage %d 70", server), fmt.Sprintf("set_device_pinned_mem_limit %d 0 20480M", server)} {
		if !strings.Contains(log, want) {
			t.Errorf("the daemon was not told %q; it was told %s", want, log)
		}
	}
	if got, ok := m.ServerLimits("GPU-a"); !ok || got != l {
		t.Errorf("ServerLimits = %+v, %v", got, ok)
	}
	// The daemon dies and is restarted: the limits come back.
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, server)
	m.Check(ctx)
	check("after a restart")
	// The small tenant that clears its variables gets the server's limit:
	// 20480 MiB and 70 % where it was granted 8192 MiB and 30 %.
	if g := gpu.GuaranteeOf(gpu.ModeMPS, tenants[0], gpu.IsolationOffer{MPSLimits: true}, l); g.Memory != gpu.MechanismMPSClient {
		t.Errorf("the small tenant's guarantee is %v; it can take the large tenant's limit, so it must read mps-client", g)
	}
}
