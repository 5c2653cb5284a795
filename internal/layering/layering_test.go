// Package layering holds the test that keeps the packages' dependencies the
// way DESIGN.md draws them.
package layering

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/tessera-gpu/tessera/"

// TestDependencies: the node agent links the preemption notice contract,
// never the preemption controller or the scheduler plugin; the pure
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
		{"cmd/tessera-agent", []string{module + "pkg/preemption/controller", module + "pkg/scheduler", "k8s.io/kubernetes/pkg/scheduler"}},
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
