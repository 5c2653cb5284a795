package deviceplugin

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/pkg/agent/driverspec"
	"github.com/tessera-gpu/tessera/pkg/agent/driverspec/driverspectest"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

// TestSlotSpecsGiveExactlyTheAssignedGPUs: the slot specs of a container
// assigned GPU 2 of a DGX H200 (mock), resolved by CDI's own injector as
// containerd and CRI-O resolve them, give the container /dev/nvidia2, the
// driver's control nodes and libraries, and no other GPU's device node —
// whatever NVIDIA_VISIBLE_DEVICES says.
func TestSlotSpecsGiveExactlyTheAssignedGPUs(t *testing.T) {
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
	driver, err := driverspec.Generate(srv, driverspec.Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	assigned := devs[2].UUID
	e, err := EditsFor(gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: assigned, MemoryMiB: 1024, CoresPerMille: 1000}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.Driver, err = driver.For([]string{assigned}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	slots := []string{assigned + "-s0", assigned + "-s1"}
	if err := WriteSpec(dir, slots, e); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("CDI refuses the specs: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	names := []string{CDIKind + "=" + slots[0], CDIKind + "=" + slots[1]}
	if unresolved, err := cache.InjectDevices(spec, names...); err != nil {
		t.Fatalf("inject %v: unresolved %v: %v", names, unresolved, err)
	}
	var nodes []string
	for _, d := range spec.Linux.Devices {
		nodes = append(nodes, d.Path)
	}
	for _, want := range []string{"/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"} {
		if !slices.Contains(nodes, want) {
			t.Errorf("container device nodes %v lack %s", nodes, want)
		}
	}
	for _, n := range nodes {
		if rest := strings.TrimPrefix(n, "/dev/nvidia"); rest != n && rest != "2" && strings.Trim(rest, "0123456789") == "" {
			t.Errorf("container gets %s, a GPU it was not assigned", n)
		}
	}
	if !slices.Contains(spec.Process.Env, "NVIDIA_VISIBLE_DEVICES="+assigned) {
		t.Errorf("env %v lacks the assignment", spec.Process.Env)
	}
	var mounts []string
	for _, m := range spec.Mounts {
		mounts = append(mounts, m.Destination)
	}
	if !slices.Contains(mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15") {
		t.Errorf("mounts %v lack the driver's libcuda", mounts)
	}
	// The driver's hooks run once, not once per slot.
	if spec.Hooks != nil {
		seen := map[string]bool{}
		for _, h := range spec.Hooks.CreateContainer {
			k := strings.Join(h.Args, " ")
			if seen[k] {
				t.Errorf("hook %q injected twice", k)
			}
			seen[k] = true
		}
	}
}
