//go:build linux

package privatemount

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The test binary plays two parts: run plainly, the tests below; re-run by
// them with envPart set, a test binary whose TestMain covers the paths the
// parent names (as deviceplugin's does with kubelet's directory) and whose
// one test writes there.
const (
	envPart  = "TESSERA_PRIVATEMOUNT_PART"
	envPaths = "TESSERA_PRIVATEMOUNT_PATHS"
)

func TestMain(m *testing.M) {
	if os.Getenv(envPart) == "covered" {
		Main(m, strings.Split(os.Getenv(envPaths), ",")...)
	}
	os.Exit(m.Run())
}

// TestCoveredPart runs only as the re-run: inside the private namespace,
// each covered path starts empty, and what it writes there stays there.
func TestCoveredPart(t *testing.T) {
	if os.Getenv(envPart) != "covered" {
		t.Skip("runs as TestHostPathsAreLeftUntouched's child")
	}
	if err := Err(); err != nil {
		t.Skip(err)
	}
	for _, p := range strings.Split(os.Getenv(envPaths), ",") {
		entries, err := os.ReadDir(p)
		if err != nil || len(entries) != 0 {
			t.Fatalf("%s inside the namespace: %d entries, %v; want an empty directory", p, len(entries), err)
		}
		if err := os.WriteFile(filepath.Join(p, "kubelet.sock"), []byte("written by a test"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot lists a directory's entries with their sizes and times: what a
// test must leave as it found it.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return "(absent)"
	}
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue
		}
		b.WriteString(e.Name() + " " + info.Mode().String() + " " + info.ModTime().Format(time.RFC3339Nano) + "\n")
	}
	return b.String()
}

// TestHostPathsAreLeftUntouched: a test binary that writes into covered
// paths — a scratch directory holding a file, standing for a node's
// kubelet directory with kubelet's socket, and kubelet's and CDI's real
// directories themselves — leaves the host's files as they were: the file
// is there, unchanged, and nothing the test wrote is.
func TestHostPathsAreLeftUntouched(t *testing.T) {
	if os.Getenv(envPart) != "" {
		t.Skip("the parent's test")
	}
	scratch := filepath.Join(t.TempDir(), "var", "lib", "kubelet", "device-plugins")
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	sentinel := filepath.Join(scratch, "kubelet.sock")
	if err := os.WriteFile(sentinel, []byte("the host's kubelet"), 0o600); err != nil {
		t.Fatal(err)
	}
	paths := []string{scratch, "/var/lib/kubelet/device-plugins", "/var/run/cdi"}
	before := map[string]string{}
	for _, p := range paths {
		before[p] = snapshot(t, p)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestCoveredPart$", "-test.v")
	cmd.Env = append(os.Environ(), envPart+"=covered", envPaths+"="+strings.Join(paths, ","))
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatalf("the covered test failed: %v", err)
	}
	if strings.Contains(string(out), "--- SKIP") {
		t.Skipf("no private mount namespace here: %s", out)
	}
	if !strings.Contains(string(out), "--- PASS: TestCoveredPart") {
		t.Fatal("the covered test did not run")
	}
	if b, err := os.ReadFile(sentinel); err != nil || string(b) != "the host's kubelet" {
		t.Errorf("the host's file after the test: %q, %v; want it untouched", b, err)
	}
	for _, p := range paths {
		if after := snapshot(t, p); after != before[p] {
			t.Errorf("%s changed:\nbefore:\n%s\nafter:\n%s", p, before[p], after)
		}
	}
}
