package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/pkg/playground"
)

// TestMain lets this test binary stand in for nvidia-cuda-mps-control, as
// the tessera binary does for `tessera up`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "mps-control" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// upPlayground starts a playground in this process for a CLI test, this
// test binary standing in for the MPS control program (TestMain), and
// stops it when the test ends.
func upPlayground(t *testing.T, opts playground.Options) *playground.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a playground; skipped with -short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts.MPSControl = []string{exe, "mps-control"}
	c, err := playground.Up(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Down)
	return c
}

// TestUpKeepsItsLog: `tessera up --demo` runs the sample workload and, when
// it exits, says where the components' log is and leaves it there (issue
// 15: it was removed with the state directory).
func TestUpKeepsItsLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole playground; skipped with -short")
	}
	code, out, errOut := runCLI(t, "up", "--demo")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, errOut, out)
	}
	m := regexp.MustCompile(`Components' log kept at (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no word of the log in:\n%s", out)
	}
	defer os.Remove(m[1])
	fi, err := os.Stat(m[1])
	if err != nil || fi.Size() == 0 {
		t.Fatalf("log %s: %v (size %v)", m[1], err, fi)
	}
}

// TestUpReportsAFailedStart: a playground that cannot start (here, a
// TMPDIR too deep for kubelet's unix sockets) exits non-zero with the cause
// and what to do, not a panic (issue 38: the start-up error was hidden by a
// nil-pointer panic, and named a --dir flag that does not exist).
func TestUpReportsAFailedStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	deep := t.TempDir()
	for len(deep) < 110 {
		deep = filepath.Join(deep, "a-directory-far-too-deep-for-unix-sockets")
	}
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", deep)
	code, out, errOut := runCLI(t, "up", "--demo", "--nodes", "1", "--gpus-per-node", "1")
	if code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	if strings.Contains(errOut, "panic") || strings.Contains(errOut, "goroutine ") {
		t.Errorf("panicked:\n%s", errOut)
	}
	if !strings.Contains(errOut, "tessera up: state directory") || !strings.Contains(errOut, "too deep for unix sockets") ||
		!strings.Contains(errOut, "point TMPDIR at a shorter directory") || strings.Contains(errOut, "--dir") {
		t.Errorf("stderr does not give the cause and the remedy:\n%s\nstdout:\n%s", errOut, out)
	}
}
