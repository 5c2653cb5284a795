package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

// useMockH200 points tessera gpus at a DGX H200 mock for the test: busy
// GPUs, one process on GPU 3.
func useMockH200(t *testing.T) {
	srv := dgxh200.New()
	nvmltest.Install(srv, func(i int) *nvmltest.Reading {
		r := &nvmltest.Reading{SMCount: 132, Util: 40, TempC: 55, PowerMW: 500000, NVLink: true}
		if i == 3 {
			r.Procs = []gonvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 2 << 30}}
		}
		return r
	})
	old := newNVML
	t.Cleanup(func() { newNVML = old })
	newNVML = func() gonvml.Interface { return srv }
}

func TestGPUsReadsTheMockServer(t *testing.T) {
	useMockH200(t)
	code, out, errOut := runCLI(t, "gpus", "--samples", "2", "--interval", "1ms")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"NVIDIA H200 141GB HBM3e", "144384", "[0 1 2 4 5 6 7]", "sample 2", "4242:2048:n/a"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestGPUsAsData: -o json carries the same readings, a reading the GPU does
// not report as null rather than a NaN no JSON reader takes.
func TestGPUsAsData(t *testing.T) {
	useMockH200(t)
	code, out, errOut := runCLI(t, "gpus", "--samples", "1", "--interval", "1ms", "-o", "json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var report struct {
		GPUs []struct {
			Model string `json:"model"`
		} `json:"gpus"`
		Samples []struct {
			GPUs []struct {
				Index     int `json:"index"`
				Processes []struct {
					PID    int      `json:"pid"`
					SMUtil *float64 `json:"smUtilPercent"`
				} `json:"processes"`
			} `json:"gpus"`
		} `json:"samples"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(report.GPUs) != 8 || report.GPUs[0].Model != "NVIDIA H200 141GB HBM3e" || len(report.Samples) != 1 {
		t.Fatalf("report %+v", report)
	}
	p := report.Samples[0].GPUs[3].Processes
	if len(p) != 1 || p[0].PID != 4242 || p[0].SMUtil != nil {
		t.Errorf("GPU 3's processes %+v, want pid 4242 with no SM reading", p)
	}
	// -o yaml, which --help advertises too, carries the same.
	code, out, errOut = runCLI(t, "gpus", "--samples", "1", "--interval", "1ms", "-o", "yaml")
	if code != exitOK {
		t.Fatalf("-o yaml: exit %d: %s", code, errOut)
	}
	var fromYAML struct {
		GPUs []struct {
			Model string `json:"model"`
		} `json:"gpus"`
	}
	if err := yaml.Unmarshal([]byte(out), &fromYAML); err != nil || len(fromYAML.GPUs) != 8 || fromYAML.GPUs[0].Model != "NVIDIA H200 141GB HBM3e" {
		t.Errorf("-o yaml: %v, %+v\n%s", err, fromYAML, out)
	}
}

// TestGPUsWithoutADriver runs the real NVML loader: on a machine without
// the NVIDIA driver (CI) it must say so and exit 3; on a GPU node it reads.
func TestGPUsWithoutADriver(t *testing.T) {
	code, out, errOut := runCLI(t, "gpus", "--samples", "0")
	switch code {
	case exitNoDriver:
		if !strings.Contains(errOut, "no NVIDIA driver") {
			t.Errorf("stderr %q does not say what is missing", errOut)
		}
	case exitOK:
		t.Logf("a driver is present:\n%s", out)
	default:
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

// TestGPUsMPSCheck runs the MPS check against the stand-in control program
// that pkg/agent/mps's tests use.
func TestGPUsMPSCheck(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nvidia-cuda-mps-control")
	if out, err := exec.Command("go", "build", "-o", bin, "../../pkg/agent/mps/testdata/fakecontrol").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	srv := dgxh200.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
	defer func(f func() gonvml.Interface) { newNVML = f }(newNVML)
	newNVML = func() gonvml.Interface { return srv }
	code, out, errOut := runCLI(t, "gpus", "--samples", "0", "--mps-check", bin)
	if code != exitOK || !strings.Contains(out, "default active thread percentage 40, restarts 0") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// TestGPUsTimeSliceCheck: the check runs the agent's nvidia-smi command
// line on GPU 0 (long, then default back), here against a stand-in that
// records its arguments.
func TestGPUsTimeSliceCheck(t *testing.T) {
	dir := t.TempDir()
	bin, log := filepath.Join(dir, "nvidia-smi"), filepath.Join(dir, "calls")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho \"$@\" >> "+log+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := dgxh200.New()
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{} })
	defer func(f func() gonvml.Interface) { newNVML = f }(newNVML)
	newNVML = func() gonvml.Interface { return srv }
	code, out, errOut := runCLI(t, "gpus", "--samples", "0", "--timeslice-check", bin)
	if code != exitOK || !strings.Contains(out, "class long set in") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	uuid, _ := srv.Devices[0].GetUUID()
	calls, err := os.ReadFile(log)
	if want := "compute-policy -i " + uuid + " --set-timeslice 3\ncompute-policy -i " + uuid + " --set-timeslice 0\n"; err != nil || string(calls) != want {
		t.Fatalf("nvidia-smi calls %q, %v; want %q", calls, err, want)
	}
}
