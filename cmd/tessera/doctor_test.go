package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
