package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

// TestMemoryLimitsOnTheMock: limits set through the client are the mock's
// record, a simulated tenant cannot allocate past the hard limit, clearing
// removes them, and the errors a node can give are told apart.
func TestMemoryLimitsOnTheMock(t *testing.T) {
	srv := dgxh200.New()
	readings := make([]*nvmltest.Reading, len(srv.Devices))
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		readings[i] = &nvmltest.Reading{KernelLimits: i != 7}
		return readings[i]
	})
	c := open(t, srv)
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	pod := filepath.Join(root, "kubepods.slice", "kubepods-pod1.slice")
	ctr := filepath.Join(pod, "cri-containerd-1.scope")
	if err := os.MkdirAll(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	const gib = 1 << 30
	uuid := devs[0].UUID
	if err := c.SetMemoryLimits(uuid, pod, 6*gib, 8*gib); err != nil {
		t.Fatal(err)
	}
	l, found, err := c.GetMemoryLimits(uuid, pod)
	if err != nil || !found || l.Soft != 6*gib || l.Hard != 8*gib {
		t.Fatalf("GetMemoryLimits = %+v, %v, %v; want soft 6 GiB, hard 8 GiB", l, found, err)
	}
	// A process in the container's cgroup, below the pod's: the pod's limit
	// holds.
	lim := readings[0].Limits
	if err := lim.Allocate(ctr, 8*gib); err != nil {
		t.Fatalf("allocating the whole grant: %v", err)
	}
	if err := lim.Allocate(ctr, 1); !errors.Is(err, nvmltest.ErrOutOfMemory) {
		t.Fatalf("one byte past the grant: %v, want out of memory", err)
	}
	if l, _, _ := c.GetMemoryLimits(uuid, pod); l.Used != 8*gib {
		t.Errorf("used = %d, want the container's 8 GiB", l.Used)
	}
	if err := c.ClearMemoryLimits(uuid, pod); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := c.GetMemoryLimits(uuid, pod); found {
		t.Error("limits still found after clearing")
	}
	if err := lim.Allocate(ctr, 1); err != nil {
		t.Errorf("after clearing, allocation fails: %v", err)
	}
	// A cgroup that is gone; a GPU without the feature; a driver error.
	if err := c.SetMemoryLimits(uuid, filepath.Join(root, "gone"), 0, gib); !errors.Is(err, ErrCgroupUnusable) {
		t.Errorf("gone cgroup: %v, want ErrCgroupUnusable", err)
	}
	if err := c.SetMemoryLimits(devs[7].UUID, pod, 0, gib); !errors.Is(err, ErrNotSupported) {
		t.Errorf("GPU without the feature: %v, want ErrNotSupported", err)
	}
	lim.FailNext(gonvml.ERROR_UNKNOWN)
	if err := c.SetMemoryLimits(uuid, pod, 0, gib); err == nil || errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), pod) {
		t.Errorf("driver error: %v, want an error naming the cgroup", err)
	}
	if err := c.SetMemoryLimits(uuid, pod, 2*gib, gib); err == nil {
		t.Error("soft above hard accepted")
	}
}

func TestProbeMemoryLimits(t *testing.T) {
	srv := dgxh200.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading { return &nvmltest.Reading{KernelLimits: i == 0} })
	c := open(t, srv)
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	offered, why, err := c.ProbeMemoryLimits(devs[0].UUID, scratch)
	if err != nil || !offered || why != "" {
		t.Fatalf("GPU 0: offered %v, why %q, err %v; want offered", offered, why, err)
	}
	if _, found, _ := c.GetMemoryLimits(devs[0].UUID, scratch); found {
		t.Error("the probe left its limit on the scratch cgroup")
	}
	offered, why, err = c.ProbeMemoryLimits(devs[1].UUID, scratch)
	if err != nil || offered || !strings.Contains(why, "not supported") {
		t.Fatalf("GPU 1: offered %v, why %q, err %v; want not offered, saying why", offered, why, err)
	}
	if _, _, err := c.ProbeMemoryLimits(devs[0].UUID, filepath.Join(scratch, "missing")); err == nil {
		t.Error("a probe on a missing scratch cgroup answered")
	}
	driver, cuda, err := c.DriverVersion()
	if err != nil || driver != "550.54.15" || cuda != 12040 {
		t.Errorf("DriverVersion = %q, %d, %v", driver, cuda, err)
	}
}

// TestDriverWithoutTheLimitsEntryPoints: on driver 580.159 (an H200 node)
// libnvidia-ml exports no nvmlDeviceSetMemoryLimits_v1, and calling it
// through go-nvml's lazy binding killed the process ("symbol lookup
// error"). The client looks the entry points up first: the probe answers
// "not offered, this driver's NVML has no …" and nothing calls them.
func TestDriverWithoutTheLimitsEntryPoints(t *testing.T) {
	srv := dgxh200.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{KernelLimits: true} })
	for _, d := range srv.Devices {
		d := d.(*server.Device)
		d.SetMemoryLimits_v1Func = func(string, uint64, uint64) gonvml.Return {
			panic("symbol lookup error: undefined symbol: nvmlDeviceSetMemoryLimits_v1")
		}
		d.GetMemoryLimits_v1Func = func(string) (gonvml.MemoryLimits_v1, gonvml.Return) {
			panic("symbol lookup error: undefined symbol: nvmlDeviceGetMemoryLimits_v1")
		}
	}
	srv.ExtensionsFunc = func() gonvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
			if strings.Contains(name, "MemoryLimits") {
				return fmt.Errorf("undefined symbol: %s", name)
			}
			return nil
		}}
	}
	c := open(t, srv)
	devs, err := c.Devices()
	if err != nil {
		t.Fatal(err)
	}
	offered, why, err := c.ProbeMemoryLimits(devs[0].UUID, t.TempDir())
	if err != nil || offered || !strings.Contains(why, "has no nvmlDeviceSetMemoryLimits_v1") {
		t.Fatalf("probe: offered %v, why %q, err %v; want not offered, naming the missing entry point", offered, why, err)
	}
	if ok, err := c.MemoryLimitsOffered(devs[0].UUID, t.TempDir()); ok || err != nil {
		t.Errorf("MemoryLimitsOffered = %v, %v; want false, nil", ok, err)
	}
	if err := c.ClearMemoryLimits(devs[0].UUID, t.TempDir()); !errors.Is(err, ErrNotSupported) {
		t.Errorf("clear: %v, want ErrNotSupported", err)
	}
}
