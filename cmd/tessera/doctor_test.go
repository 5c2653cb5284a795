package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/pkg/doctor"
	"github.com/tessera-gpu/tessera/pkg/playground"
)

// TestDoctorNodeOnAFixture: `tessera doctor node --root DIR -o json` on a
// recorded node (the H200 mock's driver; a kubelet whose config still sets
// DynamicKubeletConfig; containerd 1.7 without CDI) reports both errors with
// their remedies and exits 2; --mps is inferred from the agent's MPS
// directories; bad flags are usage errors.
func TestDoctorNodeOnAFixture(t *testing.T) {
	useMockH200(t)
	root := t.TempDir()
	for path, body := range map[string]string{
		"proc/sys/kernel/osrelease":        "6.8.0-45-generic\n",
		"sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n",
		"var/lib/kubelet/config.yaml":      "kind: KubeletConfiguration\nfeatureGates:\n  DynamicKubeletConfig: true\n",
		"etc/containerd/config.toml":       "version = 2\n",
		"usr/bin/nvidia-smi":               "",
		"usr/bin/nvidia-cdi-hook":          "",
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := runCLI(t, "doctor", "node", "--root", root, "-o", "json")
	if code != 2 {
		t.Fatalf("exit %d, want 2 (errors found): %s%s", code, out, errOut)
	}
	var report struct {
		Worst    string `json:"worst"`
		Findings []struct {
			ID, Severity, Summary, Remedy string
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	got := map[string]string{}
	for _, f := range report.Findings {
		got[f.ID] += f.Severity + ": " + f.Summary + " / " + f.Remedy + "\n"
	}
	for id, want := range map[string]string{
		"kubelet.feature-gate": "error: kubelet's config sets feature gate DynamicKubeletConfig",
		"runtime.cdi":          "error: containerd's CDI is off",
		"driver.version":       "ok: driver 550.54.15",
		"kubelet.registration": "",
		"mps.control":          "-", // not an MPS node: no MPS checks
	} {
		switch {
		case want == "-" && got[id] != "":
			t.Errorf("%s reported on a node without MPS: %s", id, got[id])
		case want != "-" && !strings.Contains(got[id], want):
			t.Errorf("%s = %q, want %q", id, got[id], want)
		}
	}
	if report.Worst != "error" {
		t.Errorf("worst %q", report.Worst)
	}
	if code, _, errOut := runCLI(t, "doctor", "node", "--root", root, "-o", "yaml"); code != exitUsage || !strings.Contains(errOut, "want table or json") {
		t.Errorf("-o yaml: exit %d, %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "doctor", "node", "--root", filepath.Join(root, "nope")); code != exitUsage || !strings.Contains(errOut, "not a directory") {
		t.Errorf("missing root: exit %d, %s", code, errOut)
	}
}

// TestDoctorClusterOnAHealthyPlayground runs `tessera doctor cluster` as an
// operator would against a healthy playground (issue 39: it exited 2 with
// "tessera-scheduler was not found", and with --scheduler-metrics failed on
// the self-signed certificate while still saying "no metrics given"). With
// the scheduler's metrics and --insecure-metrics it is all ok; without
// --insecure-metrics it says why the metrics could not be read and what to
// pass.
func TestDoctorClusterOnAHealthyPlayground(t *testing.T) {
	c := upPlayground(t, playground.Options{Nodes: 1, GPUsPerNode: 2, Model: "a100", SchedulerReplicas: 1})
	args := []string{"doctor", "cluster", "--kubeconfig", c.Kubeconfig, "--metrics", c.Nodes[0].MetricsURL, "--scheduler-metrics", c.SchedulerMetricsURL}
	var code int
	var out, errOut string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if code, out, errOut = runCLI(t, append(args, "--insecure-metrics")...); code == exitOK || time.Now().After(deadline) {
			break
		}
	}
	if code != exitOK {
		t.Fatalf("a healthy playground: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"tessera-scheduler leads: tessera-scheduler-1", "all 10 admission policies installed and bound"} {
		if !strings.Contains(out, want) {
			t.Errorf("healthy report lacks %q:\n%s", want, out)
		}
	}
	// As data, for scripts: -o json parses back into doctor's types.
	code, out, errOut = runCLI(t, append(args, "--insecure-metrics", "-o", "json")...)
	var report struct {
		Worst    doctor.Severity  `json:"worst"`
		Findings []doctor.Finding `json:"findings"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != exitOK || report.Worst > doctor.Info || len(report.Findings) == 0 {
		t.Errorf("-o json: exit %d, %v, report %+v\n%s%s", code, err, report, out, errOut)
	}
	code, out, _ = runCLI(t, args...)
	if code != 1 || !strings.Contains(out, "the scheduler's metrics could not be read") ||
		!strings.Contains(out, "self-signed certificate by default: pass --insecure-metrics") || strings.Contains(out, "not found") {
		t.Errorf("without --insecure-metrics: exit %d, want 1 with the advice:\n%s", code, out)
	}
}

// TestDoctorRemediesNameRealCommands: every tessera command a doctor
// remedy tells the operator to run exists (its --help succeeds).
func TestDoctorRemediesNameRealCommands(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "pkg", "doctor", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	remedy := regexp.MustCompile(`Remedy:\s*(?:fmt\.Sprintf\()?"([^"]*)"`)
	command := regexp.MustCompile(`tessera( [a-z][a-z-]*)+`)
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range remedy.FindAllStringSubmatch(string(src), -1) {
			for _, cmd := range command.FindAllString(m[1], -1) {
				seen[cmd] = true
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("no remedy names a tessera command; the pattern no longer matches the sources")
	}
	for cmd := range seen {
		words := strings.Fields(cmd)[1:]
		// The command is as many words as the CLI knows; the rest is prose.
		for len(words) > 0 {
			if code, _, _ := runCLI(t, append(words, "--help")...); code == exitOK && !isParentHelp(t, words) {
				break
			}
			words = words[:len(words)-1]
		}
		if len(words) == 0 {
			t.Errorf("a remedy names %q, which is no tessera command", cmd)
		}
	}
	t.Logf("remedies name %d tessera commands, all real", len(seen))
}

// isParentHelp reports whether words name more than a command: cobra
// answers --help for a command followed by unknown words with the
// command's own help.
func isParentHelp(t *testing.T, words []string) bool {
	t.Helper()
	root := newRootCmd(io.Discard, io.Discard, new(int))
	cmd, rest, err := root.Find(words)
	return err != nil || len(rest) > 0 || cmd == root
}
