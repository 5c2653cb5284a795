package shim

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func TestLimits(t *testing.T) {
	for _, tt := range []struct {
		name string
		c    gpu.ContainerAssignment
		want string
	}{
		{"time-sliced, two GPUs", gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{
			{UUID: "GPU-a", MemoryMiB: 16384, CoresPerMille: 250}, {UUID: "GPU-b", MemoryMiB: 1, CoresPerMille: 333}}},
			"# libtessera limits of container main, written by tessera-agent\nGPU-a 17179869184 25\nGPU-b 1048576 34\n"},
		{"an MPS client: memory only", gpu.ContainerAssignment{Name: "w", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{
			{UUID: "GPU-c", MemoryMiB: 8192, CoresPerMille: 300}}},
			"# libtessera limits of container w, written by tessera-agent\nGPU-c 8589934592 30 mps\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if d := cmp.Diff(tt.want, string(Limits(tt.c))); d != "" {
				t.Errorf("Limits (-want +got):\n%s", d)
			}
		})
	}
}

func TestInstallPrepareCollect(t *testing.T) {
	src := filepath.Join(t.TempDir(), "libtessera.so")
	if err := os.WriteFile(src, []byte("library"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(t.TempDir(), filepath.Join(t.TempDir(), "missing.so")); err == nil || !strings.Contains(err.Error(), "libtessera not found at") {
		t.Errorf("Install without the library: %v, want it named", err)
	}
	root := t.TempDir()
	d, err := Install(root, src)
	if err != nil {
		t.Fatal(err)
	}
	// Installing again (an agent restart) replaces the files whole.
	if d, err = Install(root, src); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"libtessera.so": "library", "ld.so.preload": LibraryInContainer + "\n"} {
		if b, err := os.ReadFile(filepath.Join(root, path)); err != nil || string(b) != want {
			t.Errorf("%s: %q (%v), want %q", path, b, err, want)
		}
	}
	mounts, err := d.Prepare("uid-1", "main", []byte("GPU-a 1 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "pods", "uid-1", "main")
	want := []Mount{
		{HostPath: filepath.Join(root, "libtessera.so"), ContainerPath: LibraryInContainer, ReadOnly: true},
		{HostPath: filepath.Join(root, "ld.so.preload"), ContainerPath: PreloadInContainer, ReadOnly: true},
		{HostPath: filepath.Join(dir, "limits"), ContainerPath: LimitsInContainer, ReadOnly: true},
		{HostPath: filepath.Join(dir, "run"), ContainerPath: RunDirInContainer},
	}
	if d := cmp.Diff(want, mounts); d != "" {
		t.Errorf("mounts (-want +got):\n%s", d)
	}
	// A restarted container gets a fresh usage directory.
	if err := os.WriteFile(filepath.Join(dir, "run", "usage"), []byte("old counts"), 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prepare("uid-1", "main", []byte("GPU-a 2 2\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "run", "usage")); !os.IsNotExist(err) {
		t.Errorf("the restarted container's usage region survived: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "limits")); string(b) != "GPU-a 2 2\n" {
		t.Errorf("limits after the restart: %q", b)
	}
	for _, bad := range [][2]string{{"", "main"}, {"../x", "main"}, {"uid", ".."}, {"uid", "a/b"}} {
		if _, err := d.Prepare(bad[0], bad[1], nil); err == nil {
			t.Errorf("Prepare(%q, %q) accepted", bad[0], bad[1])
		}
	}
	if _, err := d.Prepare("uid-2", "main", nil); err != nil {
		t.Fatal(err)
	}
	n, err := d.Collect(func(uid string) bool { return uid == "uid-2" })
	if err != nil || n != 1 {
		t.Fatalf("Collect: %d, %v; want uid-1's directory removed", n, err)
	}
	if _, err := os.Stat(filepath.Join(root, "pods", "uid-1")); !os.IsNotExist(err) {
		t.Error("the ended pod's directory is still there")
	}
	if _, err := os.Stat(filepath.Join(root, "pods", "uid-2", "main", "limits")); err != nil {
		t.Errorf("the running pod's limits: %v", err)
	}
}

// TestClaimDirectories: a DRA claim's directory lives apart from pods'
// (Collect, which follows pods, leaves it), and ReleaseClaim removes it.
func TestClaimDirectories(t *testing.T) {
	src := filepath.Join(t.TempDir(), "libtessera.so")
	if err := os.WriteFile(src, []byte("library"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	d, err := Install(root, src)
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := d.PrepareClaim("claim-1", []byte("GPU-a 1 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	limits := filepath.Join(root, "claims", "claim-1", "limits")
	if len(mounts) != 4 || mounts[2].HostPath != limits || mounts[3].HostPath != filepath.Join(root, "claims", "claim-1", "run") {
		t.Errorf("claim mounts: %+v", mounts)
	}
	if n, err := d.Collect(func(string) bool { return false }); err != nil || n != 0 {
		t.Errorf("Collect removed %d (%v); a claim is not a pod", n, err)
	}
	if _, err := os.Stat(limits); err != nil {
		t.Errorf("the claim's limits after Collect: %v", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := d.PrepareClaim(bad, nil); err == nil {
			t.Errorf("PrepareClaim(%q) accepted", bad)
		}
		if err := d.ReleaseClaim(bad); err == nil {
			t.Errorf("ReleaseClaim(%q) accepted", bad)
		}
	}
	if err := d.ReleaseClaim("claim-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "claims", "claim-1")); !os.IsNotExist(err) {
		t.Errorf("the released claim's directory: %v", err)
	}
	if err := d.ReleaseClaim("claim-1"); err != nil {
		t.Errorf("releasing twice: %v", err)
	}
}

// TestLibraryReadsTheLimits: what Limits writes is what libtessera
// (built from libtessera/ with the C compiler, its test flavour against the
// fake driver) reads: it accepts the file and reports the assignment's
// grant, by UUID.
func TestLibraryReadsTheLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("builds libtessera; skipped with -short")
	}
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler (make test installs Debian's gcc as root): libtessera cannot be built here")
	}
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "..", "..", "..", "libtessera")
	out := t.TempDir()
	build := exec.Command("make", "-s", "-C", src, "OUT="+out, out+"/plain/limits")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building libtessera's test flavour: %v\n%s", err, b)
	}
	dir := t.TempDir()
	// The fake driver's GPU 0 (fake/fakestate.h) at 3 GiB and 40 %.
	c := gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{
		{UUID: "GPU-00000000-0000-0000-0000-000000000001", MemoryMiB: 3072, CoresPerMille: 400}}}
	if err := os.WriteFile(filepath.Join(dir, "limits"), Limits(c), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(out, "plain", "limits"), "report")
	cmd.Env = append(os.Environ(), "TESSERA_TEST_DIR="+dir, "FAKE_GPU_STATE="+filepath.Join(dir, "fake-gpu"),
		"LD_PRELOAD="+filepath.Join(out, "plain", "libtessera.so"))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("libtessera with the agent's limits: %v\n%s", err, b)
	}
	if got, want := strings.TrimSpace(string(b)), "total 3221225472"; got != want {
		t.Errorf("libtessera reports %q, want %q", got, want)
	}
}
