package deviceplugin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func TestEditsFor(t *testing.T) {
	pipe := func(uuid string) string { return "/run/mps/" + uuid }
	for _, tc := range []struct {
		name   string
		c      gpu.ContainerAssignment
		env    []string
		mounts int
		err    string
	}{
		{"whole GPUs", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeExclusive, GPUs: []gpu.GPUGrant{{UUID: "GPU-a"}, {UUID: "GPU-b"}}},
			[]string{"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"}, 0, ""},
		{"MPS client", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{{UUID: "GPU-a", MemoryMiB: 20480, CoresPerMille: 305}}},
			[]string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=31", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}, 1, ""},
		{"time-sliced", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: "GPU-a", MemoryMiB: 8192, CoresPerMille: 200}}},
			[]string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "TESSERA_GPU_CORES_PERCENT=0=20", "TESSERA_GPU_MEMORY_LIMIT_MIB=0=8192"}, 0, ""},
		{"MPS over two GPUs", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{{UUID: "GPU-a"}, {UUID: "GPU-b"}}}, nil, 0, "one daemon"},
		{"no GPU", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeMPS}, nil, 0, "names no GPU"},
		{"unknown mode", gpu.ContainerAssignment{Name: "m", Mode: "mig", GPUs: []gpu.GPUGrant{{UUID: "GPU-a"}}}, nil, 0, "unknown sharing mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := EditsFor(tc.c, pipe)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := append([]string{tc.env[0]}, slices.Sorted(slices.Values(tc.env[1:]))...)
			if !slices.Equal(e.Env, want) || len(e.Mounts) != tc.mounts {
				t.Fatalf("edits %+v, want env %v, %d mounts", e, want, tc.mounts)
			}
			if tc.mounts == 1 && (e.Mounts[0].HostPath != "/run/mps/GPU-a" || e.Mounts[0].ContainerPath != MPSPipeDirInContainer) {
				t.Fatalf("mount %+v", e.Mounts[0])
			}
		})
	}
}

func TestPreferredAllocation(t *testing.T) {
	p := New(Config{})
	resp, err := p.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs:   []string{"GPU-a-s0", "GPU-b-s1", "GPU-b-s0", "GPU-c-s0", "GPU-b-s2", "GPU-c-s3"},
		MustIncludeDeviceIDs: []string{"GPU-c-s3"},
		AllocationSize:       3,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	got := resp.ContainerResponses[0].DeviceIDs
	if want := []string{"GPU-c-s3", "GPU-b-s0", "GPU-b-s1"}; !slices.Equal(got, want) {
		t.Fatalf("preferred %v, want %v (required first, then the GPU with most free slots)", got, want)
	}
}

// TestOneDefinitionPerDevice: a slot handed from a deleted pod's container
// to a new one is defined in exactly one spec file at every moment (issue
// 15: the runtime refuses a device defined twice, and the deleted pod's
// spec still defined it until collected), and an older agent's multi-slot
// spec is collected.
func TestOneDefinitionPerDevice(t *testing.T) {
	dir := t.TempDir()
	definitions := func() map[string][]string {
		out := map[string][]string{}
		paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			var spec struct {
				Devices []struct {
					Name           string `json:"name"`
					ContainerEdits struct {
						Env []string `json:"env"`
					} `json:"containerEdits"`
				} `json:"devices"`
			}
			if err := json.Unmarshal(b, &spec); err != nil {
				t.Fatal(err)
			}
			for _, d := range spec.Devices {
				out[d.Name] = append(out[d.Name], d.ContainerEdits.Env[0])
			}
		}
		return out
	}
	old := Edits{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2"}}
	if err := WriteSpec(dir, []string{"GPU-1-s3", "GPU-2-s5"}, old); err != nil {
		t.Fatal(err)
	}
	// The pod is deleted; before any collection, a new container gets
	// GPU-2-s5.
	if err := WriteSpec(dir, []string{"GPU-2-s5"}, Edits{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-2"}}); err != nil {
		t.Fatal(err)
	}
	defs := definitions()
	for dev, envs := range defs {
		if len(envs) != 1 {
			t.Errorf("%s defined %d times: %v", dev, len(envs), envs)
		}
	}
	if got := defs["GPU-2-s5"]; len(got) == 0 || got[0] != "NVIDIA_VISIBLE_DEVICES=GPU-2" {
		t.Errorf("GPU-2-s5 resolves to %v, want the new container's GPU", got)
	}
	// An older agent's spec of two slots, and a spec of a slot no one
	// holds, are collected; held slots keep theirs.
	legacy := `{"cdiVersion":"0.6.0","kind":"tessera.dev/gpu","devices":[{"name":"GPU-3-s0","containerEdits":{"env":["A=1"]}},{"name":"GPU-3-s1","containerEdits":{"env":["A=1"]}}]}`
	if err := os.WriteFile(filepath.Join(dir, "tessera-GPU-3-s0.json"), []byte(legacy), 0o644); err != nil {
		t.Fatal(err)
	}
	// A spec written after kubelet's record was read is a container being
	// started: it stays, even though the record does not show its slot.
	if n, err := collectSpecs(dir, map[string]bool{}, time.Now().Add(-time.Minute)); err != nil || n != 0 {
		t.Fatalf("collected %d specs newer than the record, %v; want none", n, err)
	}
	n, err := collectSpecs(dir, map[string]bool{"GPU-2-s5": true, "GPU-3-s0": true}, time.Now().Add(time.Second))
	if err != nil || n != 2 {
		t.Fatalf("collected %d, %v; want GPU-1-s3's and the legacy spec", n, err)
	}
	if defs := definitions(); len(defs) != 1 || len(defs["GPU-2-s5"]) != 1 {
		t.Fatalf("left %v", defs)
	}
}
