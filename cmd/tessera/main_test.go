package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestSimBuiltIn(t *testing.T) {
	dir := t.TempDir()
	csvPath, pngPath := filepath.Join(dir, "curve.csv"), filepath.Join(dir, "plot.png")
	code, out, errOut := runCLI(t, "sim", "--seeds", "42-43", "--synthetic-nodes", "24", "--synthetic-pods", "300", "--out", csvPath, "--plot", pngPath, "--progress=false")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	for _, want := range []string{"workload synthetic", "alloc@100%", "binpack", "spread", "fgd", "tessera", "ceiling @100%: ",
		"ceiling @100% with GPU models, CPU and memory: ", "for 2 seed(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	csv, err := os.ReadFile(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	if rows := strings.Count(string(csv), "\n"); rows != 1+4*2 {
		t.Errorf("CSV has %d lines, want a header and 8 rows", rows)
	}
	png, err := os.ReadFile(pngPath)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("plot is not a PNG (err %v)", err)
	}
}

// TestSimFirstFit: --policy first-fit replays upstream DRA's device
// choice beside the others asked, and only when named: all leaves it out.
func TestSimFirstFit(t *testing.T) {
	code, out, errOut := runCLI(t, "sim", "--policy", "first-fit,tessera", "--seeds", "42", "--synthetic-nodes", "24", "--synthetic-pods", "300", "--progress=false")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	var rows []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && (f[0] == "first-fit" || f[0] == "tessera") && strings.HasSuffix(f[2], "%") {
			rows = append(rows, f[0])
		}
	}
	if !slices.Equal(rows, []string{"first-fit", "tessera"}) {
		t.Errorf("summary rows %v, want first-fit and tessera:\n%s", rows, out)
	}
	_, out, _ = runCLI(t, "sim", "--policy", "all", "--seeds", "42", "--synthetic-nodes", "24", "--synthetic-pods", "300", "--progress=false")
	if strings.Contains(out, "first-fit") {
		t.Errorf("--policy all replayed first-fit:\n%s", out)
	}
}

// TestSimTimeline: tessera sim --timeline replays the built-in workload
// by time for the policies asked, prints their row each, and writes the
// curves' CSV (to standard output with -, the summary then on standard
// error) and the two-panel plot.
func TestSimTimeline(t *testing.T) {
	dir := t.TempDir()
	pngPath := filepath.Join(dir, "timeline.png")
	code, out, errOut := runCLI(t, "sim", "--timeline", "--speedup", "2", "--policy", "fgd,tessera", "--seeds", "42-43",
		"--synthetic-nodes", "24", "--synthetic-pods", "300", "--out", "-", "--plot", pngPath, "--progress=false")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	for _, want := range []string{"workload synthetic by time: ", "300 pods, arrivals 2x as fast", "alloc mean", "alloc p5", "delay p99", "never placed", "fgd", "tessera"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("summary lacks %q:\n%s", want, errOut)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// A header, then 100 samples × 2 policies × 2 seeds.
	if lines[0] != "workload,sc_policy,seed,time_s,allocation,queue" || len(lines) != 1+100*2*2 {
		t.Errorf("CSV: header %q and %d lines, want 401", lines[0], len(lines))
	}
	if !strings.HasPrefix(lines[1], "synthetic,fgd,42,") {
		t.Errorf("first row %q", lines[1])
	}
	png, err := os.ReadFile(pngPath)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("plot is not a PNG (err %v)", err)
	}
}

// TestSimProgress: --progress draws the bar on standard error, for the
// replays and then for the ceilings, and clears it before the summary.
func TestSimProgress(t *testing.T) {
	code, out, errOut := runCLI(t, "sim", "--progress", "--policy", "fgd", "--seeds", "42-43", "--synthetic-nodes", "24", "--synthetic-pods", "300")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	for _, want := range []string{"fgd seed 42", "fgd seed 43", "ceilings, seed 42", "ceilings, seed 43", "] 100.0%", "\r"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress on standard error lacks %q:\n%q", want, errOut)
		}
	}
	if strings.Contains(out, "[=") || !strings.Contains(out, "alloc@100%") {
		t.Errorf("the bar went to standard output, or the summary did not:\n%s", out)
	}
}

func TestSimBadInput(t *testing.T) {
	dir := t.TempDir()
	nodes := filepath.Join(dir, "nodes.csv")
	pods := filepath.Join(dir, "pods.csv")
	os.WriteFile(nodes, []byte("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n"), 0o644)
	os.WriteFile(pods, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,1000,1024,1,2000\n"), 0o644)
	untimed := filepath.Join(dir, "untimed.csv")
	os.WriteFile(untimed, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\n"), 0o644)
	backwards := filepath.Join(dir, "backwards.csv")
	os.WriteFile(backwards, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\np0,1000,1024,1,500,10,5\n"), 0o644)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"malformed row", []string{"sim", "--nodes", nodes, "--pods", pods}, exitError, pods + ":3: bad trace: column gpu_milli: 2000 is outside 0..1000"},
		{"unknown policy", []string{"sim", "--policy", "firstfit"}, exitUsage, `unknown policy "firstfit"`},
		{"bad seeds", []string{"sim", "--seeds", "9-1"}, exitUsage, `--seeds "9-1"`},
		{"bad tune", []string{"sim", "--tune", "-1"}, exitUsage, "--tune -1"},
		{"half a trace", []string{"sim", "--nodes", nodes}, exitUsage, "--nodes and --pods go together"},
		{"missing file", []string{"sim", "--nodes", nodes, "--pods", filepath.Join(dir, "none.csv")}, exitError, "none.csv"},
		{"unknown command", []string{"simulate"}, exitUsage, `unknown command "simulate"`},
		{"speedup without timeline", []string{"sim", "--speedup", "3"}, exitUsage, "--speedup goes with --timeline"},
		{"tune with timeline", []string{"sim", "--timeline", "--tune", "1.2"}, exitUsage, "--tune applies to the arrival replay, not to --timeline"},
		{"bad speedup", []string{"sim", "--timeline", "--speedup", "0"}, exitUsage, "--speedup 0: must be in (0, 1000000]"},
		{"no times", []string{"sim", "--timeline", "--nodes", nodes, "--pods", untimed}, exitError, "no creation_time and deletion_time"},
		{"leaves before it arrives", []string{"sim", "--timeline", "--nodes", nodes, "--pods", backwards}, exitError,
			backwards + ":2: bad trace: pod p0 leaves (deletion_time 5) before it arrives (creation_time 10)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d", code, tt.wantCode)
			}
			if !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("stderr %q does not contain %q", errOut, tt.wantErr)
			}
			if strings.Contains(out, "alloc@100%") {
				t.Errorf("a summary was printed for a failed run:\n%s", out)
			}
		})
	}
}

func TestSimBadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tessera.yaml")
	os.WriteFile(path, []byte("apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nallocator:\n  workloadCoverage: 2\n"), 0o644)
	code, out, errOut := runCLI(t, "sim", "--config", path)
	if code != exitError || !strings.Contains(errOut, "allocator.workloadCoverage") || out != "" {
		t.Errorf("exit %d, stderr %q, stdout %q", code, errOut, out)
	}
}

// TestCLIHabits: the conventions kubectl and helm users expect.
func TestCLIHabits(t *testing.T) {
	for _, cmd := range []string{"sim", "up", "top", "gpus", "version", "completion"} {
		code, out, errOut := runCLI(t, cmd, "--help")
		if code != exitOK || !strings.Contains(out, "Usage:") {
			t.Errorf("tessera %s --help: exit %d, stdout %q, stderr %q", cmd, code, out, errOut)
		}
	}
	if code, out, _ := runCLI(t, "--version"); code != exitOK || !strings.HasPrefix(out, "tessera ") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if code, out, errOut := runCLI(t, "completion", shell); code != exitOK || !strings.Contains(out, "tessera") {
			t.Errorf("completion %s: exit %d, stderr %q", shell, code, errOut)
		}
	}
	_, out, _ := runCLI(t, "top", "--help")
	for _, flag := range []string{"--kubeconfig", "--context", "--namespace", "--server", "-o, --output"} {
		if !strings.Contains(out, flag) {
			t.Errorf("tessera top lacks %s:\n%s", flag, out)
		}
	}
	if code, _, errOut := runCLI(t, "top", "--bogus"); code != exitUsage || !strings.Contains(errOut, "unknown flag: --bogus") {
		t.Errorf("an unknown flag: exit %d, stderr %q", code, errOut)
	}
}

// TestTopWithoutACluster: with no kubeconfig anywhere, tessera top says how
// to get a cluster, not client-go's KUBERNETES_MASTER hint.
func TestTopWithoutACluster(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HOME", t.TempDir())
	code, _, errOut := runCLI(t, "top")
	if code != exitUsage || !strings.Contains(errOut, "tessera up") || strings.Contains(errOut, "KUBERNETES_MASTER") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, "top", "-o", "xml"); code != exitUsage || !strings.Contains(errOut, `-o "xml"`) {
		t.Errorf("-o xml: exit %d, stderr %q", code, errOut)
	}
}

// TestMistypedCommandsFail: a mistyped subcommand or a bad flag value exits
// 2 and points to the help of the command that refused it, as kubectl does
// (issue 39: `tessera doctor nodes` printed help and exited 0, so
// `tessera doctor nodes && echo healthy` said healthy; flag errors pointed
// to the root help).
func TestMistypedCommandsFail(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"doctor", "nodes"}, []string{`unknown command "nodes" for "tessera doctor"; did you mean node?`, "Run 'tessera doctor --help' for usage."}},
		{[]string{"doctor"}, []string{"tessera doctor needs a subcommand: node or cluster", "Run 'tessera doctor --help'"}},
		{[]string{"bogus"}, []string{`unknown command "bogus" for "tessera"`, "Run 'tessera --help' for usage."}},
		{[]string{"top", "--watch=soon"}, []string{`invalid argument "soon" for "--watch" flag`, "Run 'tessera top --help' for usage."}},
		{[]string{"doctor", "cluster", "--stall-threshold", "2"}, []string{"--stall-threshold 2: want a fraction between 0 and 1", "Run 'tessera doctor cluster --help' for usage."}},
	} {
		code, out, errOut := runCLI(t, tc.args...)
		if code != exitUsage {
			t.Errorf("tessera %v: exit %d, want %d (stdout %q)", tc.args, code, exitUsage, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("tessera %v: stderr %q lacks %q", tc.args, errOut, w)
			}
		}
	}
}

// TestMakeStampsTheVersion: every binary make builds (make demo, make
// build, make soak) says the release it was built as, as the images do:
// make's build command, run as make runs it, gives a tessera whose version
// is the one asked for (issue 44: versions stamped in every build).
func TestMakeStampsTheVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tessera; skipped with -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("needs make: ", err)
	}
	const want, rev = "v9.9.9-stamp-test", "0123abcd"
	ldflags := "-X github.com/tessera-gpu/tessera/pkg/version.Version=" + want + " -X github.com/tessera-gpu/tessera/pkg/version.Revision=" + rev
	for _, target := range []string{"demo", "build", "soak"} {
		out, err := exec.Command("make", "-C", filepath.Join("..", ".."), "-n", target, "VERSION="+want, "REVISION="+rev).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		if !strings.Contains(string(out), `-ldflags "`+ldflags+`"`) {
			t.Errorf("make %s builds without the version and revision:\n%s", target, out)
		}
	}
	bin := filepath.Join(t.TempDir(), "tessera")
	build := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tessera "+want+" (revision "+rev) {
		t.Fatalf("tessera version: %v: %s; want %s, revision %s", err, out, want, rev)
	}
	t.Logf("tessera version: %s", strings.TrimSpace(string(out)))
}
