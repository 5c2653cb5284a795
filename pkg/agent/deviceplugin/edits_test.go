package deviceplugin

import (
	"context"
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func TestEditsFor(t *testing.T) {
	pipe := func(uuid string) string { return "/run/mps/" + uuid }
	for _, tc := range []struct {
		name     string
		c        gpu.ContainerAssignment
		env      []string
		mounts   int
		enforced bool
		err      string
	}{
		{"whole GPUs", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeExclusive, GPUs: []gpu.GPUGrant{{UUID: "GPU-a"}, {UUID: "GPU-b"}}},
			[]string{"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b"}, 0, true, ""},
		{"MPS client", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{{UUID: "GPU-a", MemoryMiB: 20480, CoresPerMille: 305}}},
			[]string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=31", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}, 1, true, ""},
		{"time-sliced", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: "GPU-a", MemoryMiB: 8192, CoresPerMille: 200}}},
			[]string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "TESSERA_GPU_CORES_PERCENT=0=20", "TESSERA_GPU_MEMORY_LIMIT_MIB=0=8192"}, 0, false, ""},
		{"MPS over two GPUs", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{{UUID: "GPU-a"}, {UUID: "GPU-b"}}}, nil, 0, false, "one daemon"},
		{"no GPU", gpu.ContainerAssignment{Name: "m", Mode: gpu.ModeMPS}, nil, 0, false, "names no GPU"},
		{"unknown mode", gpu.ContainerAssignment{Name: "m", Mode: "mig", GPUs: []gpu.GPUGrant{{UUID: "GPU-a"}}}, nil, 0, false, "unknown sharing mode"},
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
			if !slices.Equal(e.Env, want) || len(e.Mounts) != tc.mounts || e.Enforced != tc.enforced {
				t.Fatalf("edits %+v, want env %v, %d mounts, enforced %v", e, want, tc.mounts, tc.enforced)
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
