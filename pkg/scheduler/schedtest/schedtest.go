// Package schedtest builds what the scheduler's tests share — node
// inventories and their node objects, the scheduler's view of a node,
// allocator requests and grants — in the manner of kube-scheduler's
// testing package (st.MakePod()). Only tests import it.
package schedtest

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Inventory is a node of gpus healthy H100s of memMiB each, MPS-capable
// when mps; GPU i's UUID is GPU-<node>-<i>.
func Inventory(node string, gpus int, memMiB int64, mps bool) *gpu.NodeInventory {
	inv := &gpu.NodeInventory{Node: node, CPUMilli: 64000, MemoryMiB: 512 << 10}
	for i := range gpus {
		inv.GPUs = append(inv.GPUs, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Model: "H100", MemoryMiB: memMiB, Healthy: true, MPSCapable: mps})
	}
	return inv
}

// InventoryNode is a node object carrying inv as its annotation, with 8
// device-plugin slots per GPU allocatable.
func InventoryNode(t testing.TB, inv *gpu.NodeInventory) *v1.Node {
	t.Helper()
	raw, err := gpu.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: inv.Node, UID: types.UID(inv.Node), Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{gpu.ResourceGPU: resource.MustParse(fmt.Sprint(8 * len(inv.GPUs)))}}}
}

// SnapshotOf is the scheduler's own view of a node: the node and the pods
// it counts there.
func SnapshotOf(node *v1.Node, pods ...*v1.Pod) fwk.NodeInfo {
	n := framework.NewNodeInfo(pods...)
	n.SetNode(node)
	return n
}

// WholeGPUs is what podgpu.Request reads from one container asking for n
// whole GPUs (tessera.dev/gpu: n).
func WholeGPUs(n int) *allocator.Request {
	return &allocator.Request{Sharing: gpu.ModeAuto, Containers: []allocator.Container{{Name: "m", Count: n, Whole: true}}}
}

// SliceOf is what podgpu.Request reads from one container asking for a
// slice of one GPU: memMiB and coresPercent of its SMs, in mode.
func SliceOf(mode gpu.SharingMode, memMiB int64, coresPercent int) *allocator.Request {
	return &allocator.Request{Sharing: mode, Containers: []allocator.Container{{Name: "m", Count: 1, MemoryMiB: memMiB, Cores: coresPercent * gpu.CoresPerGPU / 100}}}
}

// NewAllocator is the allocator of the default configuration.
func NewAllocator(t testing.TB) *allocator.Allocator {
	t.Helper()
	cfg := config.Default().Allocator
	a, err := allocator.New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Grant is an assignment of one container "m" to GPU gpuIdx of node
// (UUID as Inventory names it): memMiB and cores per mille, in mode.
func Grant(node string, gpuIdx int, memMiB int64, cores int, mode gpu.SharingMode) *gpu.PodAssignment {
	return &gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{{Name: "m", Mode: mode,
		GPUs: []gpu.GPUGrant{{UUID: fmt.Sprintf("GPU-%s-%d", node, gpuIdx), Index: gpuIdx, MemoryMiB: memMiB, CoresPerMille: cores}}}}}
}

// GPUPod is a pod asking for whole GPUs; with a node, bound there with an
// assignment of its GPU index g.
func GPUPod(t testing.TB, name string, node string, g int) *v1.Pod {
	t.Helper()
	never := v1.PreemptNever
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID(name), Annotations: map[string]string{}},
		Spec: v1.PodSpec{PreemptionPolicy: &never, Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{
			Limits:   v1.ResourceList{gpu.ResourceGPU: resource.MustParse("1")},
			Requests: v1.ResourceList{gpu.ResourceGPU: resource.MustParse("1")}}}}}}
	if node != "" {
		enc, err := gpu.EncodeAssignment(Grant(node, g, 81920, 1000, gpu.ModeExclusive))
		if err != nil {
			t.Fatal(err)
		}
		pod.Annotations[gpu.AnnotationAssignment] = enc
		pod.Spec.NodeName = node
	}
	return pod
}
