package tenants

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const cid = "3f1b0c2d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff0"

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
