package main

import (
	"os"
	"regexp"
	"testing"
)

// TestMain lets this test binary stand in for nvidia-cuda-mps-control, as
// the tessera binary does for `tessera up`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "mps-control" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
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
