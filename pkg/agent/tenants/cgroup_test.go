package tenants

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const cid = "3f1b0c2d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff0"

func TestParseCgroup(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       CgroupRef
		err        error
	}{
		{"v2 systemd containerd",
			"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/cri-containerd-" + cid + ".scope\n",
			CgroupRef{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"v2 cgroupfs",
			"0::/kubepods/besteffort/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de/" + cid + "\n",
			CgroupRef{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"v2 guaranteed pod, crio",
			"0::/kubepods.slice/kubepods-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/crio-" + cid + ".scope",
			CgroupRef{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"v1 hierarchies",
			"12:pids:/system.slice/containerd.service\n11:memory:/kubepods/burstable/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de/docker-" + cid + ".scope\n",
			CgroupRef{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de", ContainerID: cid}, nil},
		{"pod sandbox level only",
			"0::/kubepods/burstable/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de\n",
			CgroupRef{PodUID: "0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de"}, nil},
		{"host process", "0::/system.slice/nvidia-mps.service\n", CgroupRef{}, ErrNotAPod},
		{"empty", "", CgroupRef{}, ErrNotAPod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCgroup(tc.data)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("ParseCgroup = %+v, %v; want %+v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// FuzzParseCgroup: any file content parses without panicking, and what it
// returns is well formed.
func FuzzParseCgroup(f *testing.F) {
	f.Add("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c6e1a9a_3a9e_4f0e_9a55_6f7b2f2bb1de.slice/cri-containerd-" + cid + ".scope\n")
	f.Add("11:memory:/kubepods/burstable/pod0c6e1a9a-3a9e-4f0e-9a55-6f7b2f2bb1de/" + cid)
	f.Add("0::/")
	f.Add(":::\n::kubepods:pod")
	f.Fuzz(func(t *testing.T, data string) {
		ref, err := ParseCgroup(data)
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

func TestResolverNamesEachTenant(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, data string) {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cidB := strings.Repeat("b", 64)
	write("100", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-"+cid+".scope\n")
	write("200", "0::/kubepods/besteffort/pod66666666-7777-8888-9999-000000000000/"+cidB+"\n")
	write("300", "0::/system.slice/nvidia-mps.service\n")
	pods := []*v1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "train-0", UID: "11111111-2222-3333-4444-555555555555"},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "trainer"}, {Name: "sidecar"}}},
			Status: v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{
				{Name: "sidecar", ContainerID: "containerd://" + strings.Repeat("c", 64)},
				{Name: "trainer", ContainerID: "containerd://" + cid}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "infer-7", UID: "66666666-7777-8888-9999-000000000000"},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "server"}}}},
	}
	calls := 0
	r := NewResolver(proc, func() []*v1.Pod { calls++; return pods })
	got := r.Resolve([]uint32{100, 200, 300, 400})
	want := map[uint32]Tenant{100: {"team-a", "train-0", "trainer"}, 200: {"team-b", "infer-7", "server"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Resolve = %v, want %v", got, want)
	}
	// A steady process set is answered from memory.
	if got := r.Resolve([]uint32{100, 200}); !reflect.DeepEqual(got, want) || calls != 1 {
		t.Fatalf("second pass = %v after %d pod listings", got, calls)
	}
}
