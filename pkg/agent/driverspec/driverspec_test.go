package driverspec

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"

	"github.com/tessera-gpu/tessera/internal/privatemount"
	"github.com/tessera-gpu/tessera/pkg/agent/driverspec/driverspectest"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

func TestMain(m *testing.M) {
	// A private mount namespace: the fake driver root's device nodes may
	// be /dev/null bound over files.
	privatemount.Main(m)
}

// TestEditsNameExactlyTheAssignedGPUs: NVIDIA's generator, run on the DGX
// H200 mock and a driver root, gives a container with GPUs 2 and 5 the
// driver's files and control nodes and those two GPUs' device nodes — no
// other GPU's.
func TestEditsNameExactlyTheAssignedGPUs(t *testing.T) {
	srv := dgxh200.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
	c, err := nvml.New(srv)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	root := driverspectest.Root(t, len(devs), "550.54.15")
	e, err := Generate(srv, Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if e.Driver != "550.54.15" || len(e.GPUs()) != len(devs) {
		t.Fatalf("generated for driver %q, %d GPUs; want 550.54.15 and %d", e.Driver, len(e.GPUs()), len(devs))
	}
	got, err := e.For([]string{devs[2].UUID, devs[5].UUID})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range got.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia2", "/dev/nvidia5"} {
		if !slices.Contains(nodes, want) {
			t.Errorf("device nodes %v lack %s", nodes, want)
		}
	}
	for _, n := range nodes {
		if strings.HasPrefix(n, "/dev/nvidia") && n != "/dev/nvidia2" && n != "/dev/nvidia5" && strings.TrimLeft(strings.TrimPrefix(n, "/dev/nvidia"), "0123456789") == "" {
			t.Errorf("device node %s of a GPU not assigned", n)
		}
	}
	var mounts []string
	for _, m := range got.Mounts {
		mounts = append(mounts, m.ContainerPath)
	}
	if !slices.Contains(mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15") {
		t.Errorf("mounts %v lack the driver's libcuda", mounts)
	}
	for _, env := range got.Env {
		if strings.HasPrefix(env, "NVIDIA_VISIBLE_DEVICES=") {
			t.Errorf("the driver edits set %s; the assignment's UUIDs are Tessera's to set", env)
		}
	}
	if _, err := e.For([]string{"GPU-unknown"}); err == nil {
		t.Error("a GPU the generator did not find was accepted")
	}
}
