package mps

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// controlBinary is the stand-in built from testdata/fakecontrol (usingFake),
// or, when TESSERA_REAL_MPS=1 asks for it on a GPU node, the real
// nvidia-cuda-mps-control: by default the tests start no daemon on the GPUs
// of the machine they run on (people run make test on GPU nodes).
var (
	controlBinary string
	usingFake     bool
)

func TestMain(m *testing.M) {
	if p, err := exec.LookPath(DefaultBinary); err == nil && os.Getenv("TESSERA_REAL_MPS") == "1" {
		controlBinary = p
	} else {
		dir, err := os.MkdirTemp("", "fakecontrol")
		if err != nil {
			panic(err)
		}
		controlBinary, usingFake = filepath.Join(dir, "nvidia-cuda-mps-control"), true
		if out, err := exec.Command("go", "build", "-o", controlBinary, "./testdata/fakecontrol").CombinedOutput(); err != nil {
			panic(string(out))
		}
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func controlLog(t *testing.T, m *Manager, uuid string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.LogDir(uuid), "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestDaemonsPerGPUWithDefaultsAndRestart(t *testing.T) {
	if !usingFake {
		t.Skip("the real MPS daemon is checked by hack/gpu-node-check.sh on a GPU node")
	}
	root := t.TempDir()
	var (
		mu        sync.Mutex
		prepared  []string
		restarted []string
	)
	m := New(Config{Binary: controlBinary, Root: root,
		GPUs: []GPU{{UUID: "GPU-a", DefaultThreadPercentage: 50, DefaultPinnedMemMiB: 8192}, {UUID: "GPU-b", DefaultThreadPercentage: 25}},
		PrepareGPU: func(uuid string) error {
			mu.Lock()
			defer mu.Unlock()
			prepared = append(prepared, uuid)
			return nil
		},
		OnRestart: func(uuid string, _ error) {
			mu.Lock()
			defer mu.Unlock()
			restarted = append(restarted, uuid)
		},
	})
	ctx := context.Background()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx) })
	if strings.Join(prepared, ",") != "GPU-a,GPU-b" {
		t.Fatalf("compute mode set on %v", prepared)
	}
	// Each GPU has its own daemon, pipe and log, and got its own defaults.
	if got := controlLog(t, m, "GPU-a"); strings.Join(got, "|") != "set_default_active_thread_percentage 50|set_default_device_pinned_mem_limit 0 8192M" {
		t.Fatalf("GPU-a's daemon was told %q", got)
	}
	if got := controlLog(t, m, "GPU-b"); strings.Join(got, "|") != "set_default_active_thread_percentage 25" {
		t.Fatalf("GPU-b's daemon was told %q", got)
	}
	if out, err := m.control(ctx, "GPU-b", "get_default_active_thread_percentage"); err != nil || out != "25" {
		t.Fatalf("GPU-b default threads = %q, %v", out, err)
	}

	// Reclaim's request to end a leftover client reaches the GPU's server.
	if err := m.TerminateClient(ctx, "GPU-b", 4242); err != nil {
		t.Fatal(err)
	}
	if got := controlLog(t, m, "GPU-b"); got[len(got)-1] != fmt.Sprintf("terminate_client %d 4242", daemonPID(t, m, "GPU-b")) {
		t.Fatalf("GPU-b's daemon was told %q", got)
	}

	// A healthy check changes nothing.
	m.Check(ctx)
	if m.Restarts("GPU-a")+m.Restarts("GPU-b") != 0 {
		t.Fatal("a healthy daemon was restarted")
	}

	// GPU-a's daemon dies: the next check restarts it with its defaults and
	// reports it; GPU-b's is untouched.
	pid := daemonPID(t, m, "GPU-a")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	m.Check(ctx)
	if m.Restarts("GPU-a") != 1 || m.Restarts("GPU-b") != 0 || strings.Join(restarted, ",") != "GPU-a" {
		t.Fatalf("restarts a=%d b=%d, reported %v", m.Restarts("GPU-a"), m.Restarts("GPU-b"), restarted)
	}
	if daemonPID(t, m, "GPU-a") == pid {
		t.Fatal("GPU-a's daemon was not restarted")
	}
	if out, err := m.control(ctx, "GPU-a", "get_default_active_thread_percentage"); err != nil || out != "50" {
		t.Fatalf("restarted daemon's default threads = %q, %v", out, err)
	}

	// The agent restarts: Start finds the daemons running and keeps them.
	pidB := daemonPID(t, m, "GPU-b")
	m2 := New(m.cfg)
	if err := m2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if daemonPID(t, m2, "GPU-b") != pidB {
		t.Fatal("a running daemon was replaced when the agent restarted")
	}
}

func TestMissingBinaryIsAClearError(t *testing.T) {
	m := New(Config{Binary: filepath.Join(t.TempDir(), "nvidia-cuda-mps-control"), Root: t.TempDir(), GPUs: []GPU{{UUID: "GPU-a"}}})
	err := m.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "GPU GPU-a: start MPS daemon") {
		t.Fatalf("Start = %v", err)
	}
}

func daemonPID(t *testing.T, m *Manager, uuid string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(m.PipeDir(uuid), "fake.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive", pid)
		}
		// A killed child of a detached session is reaped by init; poll.
		time.Sleep(10 * time.Millisecond)
	}
}

// TestQuitThroughTheClientPipeIsUndone: every MPS client has the pipe
// directory, so a tenant can `echo quit | nvidia-cuda-mps-control` into it
// (issue 15: the GPU's daemon stopped for every tenant until the next
// check). The agent sees the control endpoint go and restarts the daemon
// at once — here the periodic check is an hour away — and reports the end
// of its control log.
func TestQuitThroughTheClientPipeIsUndone(t *testing.T) {
	if !usingFake {
		t.Skip("the real MPS daemon is checked by hack/gpu-node-check.sh on a GPU node")
	}
	causes := make(chan error, 4)
	m := New(Config{Binary: controlBinary, Root: t.TempDir(), GPUs: []GPU{{UUID: "GPU-a", DefaultThreadPercentage: 50}},
		OnRestart: func(_ string, cause error) { causes <- cause }})
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx, time.Hour) }()
	t.Cleanup(func() { cancel(); <-done; _ = m.Stop(context.Background()) })
	time.Sleep(100 * time.Millisecond) // the watch is in place

	// What a tenant can do with its mounted pipe directory.
	tenant := exec.Command(controlBinary)
	tenant.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+m.PipeDir("GPU-a"), "CUDA_MPS_LOG_DIRECTORY="+t.TempDir())
	tenant.Stdin = strings.NewReader("quit\n")
	quitAt := time.Now()
	if out, err := tenant.CombinedOutput(); err != nil {
		t.Fatalf("quit: %v: %s", err, out)
	}
	select {
	case cause := <-causes:
		t.Logf("restarted %v after the quit: %v", time.Since(quitAt).Round(time.Millisecond), cause)
		if !strings.Contains(cause.Error(), "its control endpoint left the pipe directory") || !strings.Contains(cause.Error(), "control.log ends: ") {
			t.Errorf("cause %v", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon a tenant stopped was not restarted")
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err := m.Control(ctx, "GPU-a", "get_default_active_thread_percentage")
		return err == nil && out == "50", nil
	})
	if err != nil {
		t.Fatal("the restarted daemon does not answer with its defaults")
	}
	if m.Restarts("GPU-a") != 1 {
		t.Fatalf("%d restarts, want 1", m.Restarts("GPU-a"))
	}
}
