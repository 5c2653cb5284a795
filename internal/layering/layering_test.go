// Package layering holds the test that keeps the packages' dependencies the
// way DESIGN.md draws them.
package layering

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/tessera-gpu/tessera/"

// TestDependencies: the node agent links the preemption notice contract,
// never the preemption controller or the scheduler plugin, nor the CLI's
// table or the playground; the doctor links node libraries (pkg/nvml,
// pkg/cgroup, pkg/agentendpoint), not the agent's packages or top; the pure
// packages link no Kubernetes at all (k8s.io/kubernetes costs minutes of
// compile, and decisions must not do I/O).
func TestDependencies(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command: ", err)
	}
	for _, c := range []struct {
		pkg    string
		forbid []string
	}{
		{"cmd/tessera-agent", []string{module + "pkg/preemption/controller", module + "pkg/scheduler", "k8s.io/kubernetes/pkg/scheduler",
			// The agent serves a node; the CLI's table and the
			// playground are not part of it.
			module + "pkg/top", module + "pkg/playground"}},
		// The doctor reads agents through pkg/agentendpoint, not through
		// top's table.
		{"pkg/doctor", []string{module + "pkg/top", module + "pkg/playground", module + "pkg/agent/"}},
		{"pkg/allocator", []string{"k8s.io/"}},
		{"pkg/forecast", []string{"k8s.io/"}},
		{"pkg/gpu", []string{"k8s.io/kubernetes"}},
	} {
		out, err := exec.Command("go", "list", "-deps", module+c.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", c.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range c.forbid {
				if dep == f || strings.HasPrefix(dep, strings.TrimSuffix(f, "/")+"/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f)) {
					t.Errorf("%s links %s", c.pkg, dep)
				}
			}
		}
	}
}

// TestArchitectureLayoutIsComplete: docs/architecture.md's layout table
// names every package `go list ./...` finds (or a directory above it that
// ends in /), and names no path that does not exist (issue 40: it had
// dropped seven).
func TestArchitectureLayoutIsComplete(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command: ", err)
	}
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "\n## Layout\n")
	if !ok {
		t.Fatal("docs/architecture.md has no ## Layout section")
	}
	parts := strings.SplitN(after, "```", 3)
	if len(parts) < 3 {
		t.Fatal("the Layout section has no code block")
	}
	var listed, dirs []string
	for _, line := range strings.Split(parts[1], "\n") {
		if line == "" || strings.HasPrefix(line, " ") {
			continue // a continuation
		}
		path := strings.Fields(line)[0]
		if _, err := os.Stat(filepath.Join(root, path)); err != nil {
			t.Errorf("the layout names %s, which does not exist", path)
		}
		if strings.HasSuffix(path, "/") {
			dirs = append(dirs, path)
		}
		listed = append(listed, path)
	}
	out, err := exec.Command("go", "list", module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(pkg, module)
		covered := slices.Contains(listed, rel)
		for _, d := range dirs {
			covered = covered || strings.HasPrefix(rel+"/", d)
		}
		if !covered {
			t.Errorf("docs/architecture.md's layout does not name %s", rel)
		}
	}
}
