package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestUpKeepsItsLog: `tessera up --demo` runs the sample workload, shows
// what holds each slice as the drivers nodes run give it, and, when it
// exits, says where the components' log is and leaves it there (issue 15:
// it was removed with the state directory).
func TestUpKeepsItsLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole playground; skipped with -short")
	}
	code, out, errOut := runCLI(t, "up", "--demo")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, errOut, out)
	}
	// The playground's driver is R580's by default: its time-sliced
	// slices are held by libtessera (HELD shim/shim), not the kernel.
	if !strings.Contains(out, "shim/shim") || strings.Contains(out, "kernel/") {
		t.Errorf("the demo's table does not show libtessera holding time-sliced slices (shim/shim):\n%s", out)
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

// TestUpDriverKernelLimits: `tessera up --demo --driver-kernel-limits`
// simulates a driver whose NVML sets per-cgroup memory limits: time-sliced
// slices' memory is then the kernel's, their SM share still libtessera's.
func TestUpDriverKernelLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole playground; skipped with -short")
	}
	code, out, errOut := runCLI(t, "up", "--demo", "--driver-kernel-limits", "--nodes", "2", "--mps-nodes", "0")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, errOut, out)
	}
	if !strings.Contains(out, "kernel/shim") || strings.Contains(out, "shim/shim") {
		t.Errorf("with the newer driver the demo does not show kernel/shim on its time-sliced slices:\n%s", out)
	}
	if m := regexp.MustCompile(`Components' log kept at (\S+)`).FindStringSubmatch(out); m != nil {
		os.Remove(m[1])
	}
}

// TestUpDRANodes: `tessera up --demo --dra-nodes 1` starts a node that
// serves its GPUs through DRA, and the demo's table shows the pod that
// asked with a ResourceClaim on it, with the claim's slice.
func TestUpDRANodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole playground; skipped with -short")
	}
	code, out, errOut := runCLI(t, "up", "--demo", "--nodes", "5", "--mps-nodes", "2", "--dra-nodes", "1")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s\nstdout:\n%s", code, errOut, out)
	}
	if !strings.Contains(out, "(2 in MPS mode, 1 serving DRA)") {
		t.Errorf("the banner does not say which nodes serve DRA:\n%s", out)
	}
	row := regexp.MustCompile(`gpu-node-4 .*demo/claim-slice \(claim claim-slice\)\s+\d+\s+Running\s+10240\s+25%\s+shim/shim`)
	if !row.MatchString(out) {
		t.Errorf("the demo's table lacks the claim's pod on the DRA node gpu-node-4:\n%s", out)
	}
	if m := regexp.MustCompile(`Components' log kept at (\S+)`).FindStringSubmatch(out); m != nil {
		os.Remove(m[1])
	}
	if code, _, errOut := runCLI(t, "up", "--nodes", "2", "--dra-nodes", "3"); code != exitUsage || !strings.Contains(errOut, "--dra-nodes 3: want 0–2") {
		t.Errorf("--dra-nodes above --nodes: exit %d, %q", code, errOut)
	}
}

// TestSoakDRANodes: `tessera soak --dra-nodes 1` runs a DRA node beside
// the device-plugin ones and has pods ask with ResourceClaims there. It
// runs the binary in a process of its own, as `make soak` does: the end's
// check reads the scheduler's series, which this test process's earlier
// playgrounds also wrote (issue 19).
func TestSoakDRANodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tessera and starts a whole playground; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "tessera")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "soak", "--nodes", "2", "--gpus-per-node", "2", "--mps-nodes", "0", "--dra-nodes", "1", "--events", "60", "--fault-every", "0", "--seed", "3")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out, errOut := stdout.String(), stderr.String()
	if err != nil {
		t.Fatalf("%v, stderr:\n%s\nstdout:\n%s", err, errOut, out)
	}
	if !strings.Contains(out, "(0 in MPS mode, 1 serving DRA)") {
		t.Errorf("the banner does not say which nodes serve DRA:\n%s", out)
	}
	if !regexp.MustCompile(`pod asking with a ResourceClaim\s+\d+`).MatchString(out) {
		t.Errorf("the summary counts no pod asking with a ResourceClaim:\n%s", out)
	}
	if m := regexp.MustCompile(`components' log: (\S+)`).FindStringSubmatch(out); m != nil {
		os.Remove(m[1])
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

// lockedBuffer is a buffer one goroutine writes while another reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestUpBannerReadsClean runs `tessera up` until it is up, reads what it
// tells the user, and stops it as Ctrl-C would: every line of the banner
// is indented by two spaces, none by the stray tabs of the code's
// indentation (issue 39), and the command exits 0 when stopped.
func TestUpBannerReadsClean(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a whole playground; skipped with -short")
	}
	// tessera up's web view asks this token, as $TESSERA_WEB_TOKEN says.
	t.Setenv("TESSERA_WEB_TOKEN", "s3cret")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, []string{"up", "--nodes", "1", "--gpus-per-node", "1", "--mps-nodes", "0"}, &out, &errOut)
	}()
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(out.String(), "Up. Ctrl-C stops everything") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("tessera up did not come up within 90 s:\n%s%s", out.String(), errOut.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("stopped: exit %d, want 0:\n%s", code, errOut.String())
	}
	text := out.String()
	banner := text[strings.Index(text, "Cluster up in"):strings.Index(text, "Up. Ctrl-C")]
	want := []string{"  export KUBECONFIG=", "  kubectl get nodes", "  kubectl get pods -A -o wide", "  tessera top --kubeconfig ",
		"  Web view:          http://127.0.0.1:", "  Scheduler metrics: https://127.0.0.1:", "  Agent metrics:     http://127.0.0.1:", "  Components' log:   "}
	lines := strings.Split(banner, "\n")[1:]
	var got []string
	for _, l := range lines {
		if strings.Contains(l, "\t") {
			t.Errorf("banner line %q holds a tab", l)
		}
		if l != "" {
			got = append(got, l)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("banner:\n%s", banner)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("banner line %d %q, want it to begin %q", i, got[i], w)
		}
	}
	if !strings.HasSuffix(got[4], "/?token=s3cret") {
		t.Errorf("the web view's link %q does not carry $TESSERA_WEB_TOKEN", got[4])
	}
}
