package cgroup

import (
	"errors"
	"strings"
	"testing"
)

const cid = "3f1b0c2d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff0"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       Ref
		err        error
	}{
		{"v2 systemd containerd",
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/cri-containerd-" + cid + ".scope\n",
			Ref{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"v2 cgroupfs",
			"0::/kubepods/besteffort/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de/" + cid + "\n",
			Ref{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"v2 guaranteed pod, crio",
			"0::/kubepods.slice/kubepods-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/crio-" + cid + ".scope",
			Ref{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"v1 hierarchies",
			"12:pids:/system.slice/containerd.service\n11:memory:/kubepods/burstable/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de/docker-" + cid + ".scope\n",
			Ref{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"pod sandbox level only",
			"0::/kubepods/burstable/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de\n",
			Ref{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de"}, nil},
		{"host process", "0::/system.slice/nvidia-mps.service\n", Ref{}, ErrNotAPod},
		{"empty", "", Ref{}, ErrNotAPod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.data)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("Parse = %+v, %v; want %+v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// FuzzParse: any file content parses without panicking, and what it
// returns is well formed.
func FuzzParse(f *testing.F) {
	f.Add("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/cri-containerd-" + cid + ".scope\n")
	f.Add("11:memory:/kubepods/burstable/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de/" + cid)
	f.Add("0::/")
	f.Add(":::\n::kubepods:pod")
	f.Fuzz(func(t *testing.T, data string) {
		ref, err := Parse(data)
		if err != nil {
			return
		}
		if len(ref.PodUID) != 36 || strings.Contains(ref.PodUID, "_") {
			t.Fatalf("pod UID %q", ref.PodUID)
		}
		if ref.ContainerID != "" && len(ref.ContainerID) != 64 {
			t.Fatalf("container ID %q", ref.ContainerID)
		}
	})
}
