package scheduler

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func TestClaimRequest(t *testing.T) {
	req := func(class string, capacity map[string]string) *resourceapi.ExactDeviceRequest {
		r := &resourceapi.ExactDeviceRequest{DeviceClassName: class}
		if capacity != nil {
			r.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
			for k, v := range capacity {
				r.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
			}
		}
		return r
	}
	slice := func(sharing gpu.SharingMode, memMiB int64, cores int) *allocator.Request {
		return &allocator.Request{Sharing: sharing, Containers: []allocator.Container{{Name: "claim", Count: 1, MemoryMiB: memMiB, Cores: cores}}}
	}
	whole := &allocator.Request{Sharing: gpu.ModeAuto, Containers: []allocator.Container{{Name: "claim", Count: 1, Whole: true}}}
	for _, tc := range []struct {
		name string
		in   *resourceapi.ExactDeviceRequest
		want *allocator.Request // nil: not gpu.tessera.dev's
	}{
		{"slice", req("gpu.tessera.dev", map[string]string{"memory": "10Gi", "cores": "25"}), slice(gpu.ModeAuto, 10240, 250)},
		{"memory rounded up to MiB", req("gpu.tessera.dev", map[string]string{"memory": "1500000", "cores": "10"}), slice(gpu.ModeAuto, 2, 100)},
		{"mps class", req("mps.gpu.tessera.dev", map[string]string{"memory": "4Gi", "cores": "50"}), slice(gpu.ModeMPS, 4096, 500)},
		{"time-sliced class", req("time-sliced.gpu.tessera.dev", map[string]string{"memory": "4Gi", "cores": "50"}), slice(gpu.ModeTimeSlicing, 4096, 500)},
		// The request policies' defaults: every core, so the whole GPU.
		{"no capacity", req("gpu.tessera.dev", nil), whole},
		{"memory only", req("gpu.tessera.dev", map[string]string{"memory": "10Gi"}), whole},
		{"every core", req("gpu.tessera.dev", map[string]string{"cores": "100"}), whole},
		{"whole class", req("whole.gpu.tessera.dev", map[string]string{"memory": "10Gi", "cores": "25"}), whole},
		{"another driver's class", req("gpu.nvidia.com", nil), nil},
		{"a name ending like ours", req("xgpu.tessera.dev", nil), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ClaimRequest(tc.in)
			if ok != (tc.want != nil) {
				t.Fatalf("ClaimRequest ok = %v, want %v", ok, tc.want != nil)
			}
			if ok && (got.Sharing != tc.want.Sharing || !slices.Equal(got.Containers, tc.want.Containers)) {
				t.Errorf("ClaimRequest = %+v, want %+v", got, tc.want)
			}
			if ok {
				if err := got.Check(); err != nil {
					t.Errorf("the request fails the allocator's check: %v", err)
				}
			}
		})
	}
}

// TestSpecRequest: a claim's first gpu.tessera.dev request is ranked, an
// exact one or the first of Tessera's alternatives in a prioritized list;
// a claim of other drivers alone is not.
func TestSpecRequest(t *testing.T) {
	capacity := &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse("8Gi"), "cores": resource.MustParse("50")}}
	spec := func(reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaimSpec {
		return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
	}
	nic := resourceapi.DeviceRequest{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.example.com"}}
	prioritized := resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "theirs", DeviceClassName: "gpu.nvidia.com"},
		{Name: "mps", DeviceClassName: "mps.gpu.tessera.dev", Capacity: capacity},
		{Name: "whole", DeviceClassName: "whole.gpu.tessera.dev"},
	}}
	got := specRequest(spec(nic, prioritized))
	if got == nil || got.Sharing != gpu.ModeMPS || got.Containers[0].MemoryMiB != 8192 || got.Containers[0].Cores != 500 {
		t.Errorf("a prioritized list: %+v, want its MPS alternative's 8 GiB, 50 %%", got)
	}
	exact := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.tessera.dev"}}
	if got := specRequest(spec(nic, exact, prioritized)); got == nil || !got.Containers[0].Whole {
		t.Errorf("an exact request first: %+v, want its whole GPU", got)
	}
	if got := specRequest(spec(nic)); got != nil {
		t.Errorf("another driver's claim: %+v", got)
	}
}

func draNode(t *testing.T) *allocator.Node {
	t.Helper()
	inv := &gpu.NodeInventory{Node: "n1", CPUMilli: 64000, MemoryMiB: 256 << 10}
	for i := range 3 {
		inv.GPUs = append(inv.GPUs, gpu.Device{Index: i, UUID: "GPU-" + string(rune('a'+i)), Model: "H100", MemoryMiB: 81920, Healthy: true, MPSCapable: true})
	}
	n, err := allocator.NewNode(inv)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func device(name string, memMiB, cores int64, taints ...resourceapi.DeviceTaint) resourceapi.Device {
	return resourceapi.Device{Name: name, Taints: taints, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		gpu.DRAMemory: {Value: *resource.NewQuantity(memMiB<<20, resource.BinarySI)},
		gpu.DRACores:  {Value: *resource.NewQuantity(cores, resource.DecimalSI)},
	}}
}

// TestClaimsCountedOnTheNode: what the slice says the device plugin's pods
// hold and what allocated claims consumed are counted on the cache's
// node, so the gradient ranks GPUs by what is really free.
func TestClaimsCountedOnTheNode(t *testing.T) {
	n := draNode(t)
	s := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: gpu.DRADriver, Pool: resourceapi.ResourcePool{Name: "n1"}, NodeName: ptr.To("n1"),
		Devices: []resourceapi.Device{
			device("gpu-0", 81920, 100),
			device("gpu-1", 81920-20480, 75), // a device-plugin pod holds 20 GiB and 25 %
			device("gpu-2", 81920, 100, resourceapi.DeviceTaint{Key: "gpu.tessera.dev/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}),
		}}}
	heldOutsideClaims(n, s, 1)
	share := types.UID("share")
	claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{
			{Driver: gpu.DRADriver, Pool: "n1", Device: "gpu-0", ShareID: &share, ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
				gpu.DRAMemory: resource.MustParse("8Gi"), gpu.DRACores: resource.MustParse("10")}},
			{Driver: "other.example.com", Pool: "n1", Device: "gpu-1"},
		}}}}}
	occupy(map[string]*allocator.Node{"n1": n}, claim)
	for i, want := range []struct {
		mem     int64
		cores   int
		healthy bool
	}{{8192, 100, true}, {20480, 250, true}, {0, 0, false}} {
		g := n.GPUs[i]
		if g.MemoryUsedMiB() != want.mem || g.CoresUsed() != want.cores || g.Healthy != want.healthy {
			t.Errorf("GPU %d: %d MiB, %d‰ cores, healthy %v; want %d MiB, %d‰, %v", i, g.MemoryUsedMiB(), g.CoresUsed(), g.Healthy, want.mem, want.cores, want.healthy)
		}
	}
}

func TestRankDevicesCopies(t *testing.T) {
	ours := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: gpu.DRADriver, Pool: resourceapi.ResourcePool{Name: "n1"},
		Devices: []resourceapi.Device{{Name: "gpu-0"}, {Name: "gpu-1"}, {Name: "gpu-2"}, {Name: "extra"}}}}
	theirs := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "other.example.com", Pool: resourceapi.ResourcePool{Name: "n1"},
		Devices: []resourceapi.Device{{Name: "gpu-0"}, {Name: "gpu-1"}}}}
	out := rankDevices([]*resourceapi.ResourceSlice{ours, theirs}, map[string]map[string]int{"n1": {"gpu-2": 0, "gpu-0": 1, "gpu-1": 2}})
	names := func(s *resourceapi.ResourceSlice) (n []string) {
		for _, d := range s.Spec.Devices {
			n = append(n, d.Name)
		}
		return n
	}
	if got := names(out[0]); !slices.Equal(got, []string{"gpu-2", "gpu-0", "gpu-1", "extra"}) {
		t.Errorf("ranked slice's devices: %v", got)
	}
	if got := names(ours); !slices.Equal(got, []string{"gpu-0", "gpu-1", "gpu-2", "extra"}) {
		t.Errorf("the informer's slice was changed: %v", got)
	}
	if out[1] != theirs {
		t.Error("another driver's slice was copied or reordered")
	}
}

func allocatedClaim(name, device string, cores int64, holders ...string) *resourceapi.ResourceClaim {
	share := types.UID("share-" + name)
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Driver: gpu.DRADriver, Pool: "n1", Device: device, ShareID: &share,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{gpu.DRAMemory: resource.MustParse("8Gi"), gpu.DRACores: *resource.NewQuantity(cores, resource.DecimalSI)}}}}}}}
	for _, h := range holders {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: h, UID: types.UID(h)})
	}
	return c
}

// TestClaimHolders: each pod holding claims alone is a candidate with
// its claims' grants; a shared claim stays counted with no candidate; a
// claim no pod holds any more (being deallocated) counts as gone.
func TestClaimHolders(t *testing.T) {
	base := draNode(t)
	claims := []*resourceapi.ResourceClaim{
		allocatedClaim("a", "gpu-0", 100, "pod-a"),
		allocatedClaim("a2", "gpu-1", 25, "pod-a"),
		allocatedClaim("shared", "gpu-1", 50, "pod-b", "pod-c"),
		allocatedClaim("leaving", "gpu-2", 100),
	}
	podOf := func(ns, name string, uid types.UID) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}, Spec: v1.PodSpec{NodeName: "n1"}}
	}
	usage, bound := claimHolders("n1", base, claims, podOf)
	if len(bound) != 1 || bound[0].pod.Name != "pod-a" || len(bound[0].assignment.Containers) != 2 {
		t.Fatalf("candidates %+v; want pod-a with both its claims", bound)
	}
	if got := []int{usage.GPUs[0].CoresUsed(), usage.GPUs[1].CoresUsed(), usage.GPUs[2].CoresUsed()}; !slices.Equal(got, []int{1000, 750, 0}) {
		t.Errorf("cores counted per GPU: %v; want [1000 750 0]", got)
	}
	if base.GPUs[0].CoresUsed() != 0 {
		t.Error("claimHolders changed the base node")
	}
	// What planPreemption does with the candidate: release it, and a
	// whole GPU fits GPU 0 again.
	usage.RemoveAssignment(bound[0].assignment, 0, 0)
	if got := []int{usage.GPUs[0].CoresUsed(), usage.GPUs[1].CoresUsed()}; !slices.Equal(got, []int{0, 500}) {
		t.Errorf("after releasing pod-a: %v; want [0 500]", got)
	}
}

// TestHeldForNominated: what a nominated preemptor would take is kept
// from a pod filtered after it, once the preemptor fits.
func TestHeldForNominated(t *testing.T) {
	a, err := allocator.New(&config.Default().Allocator, nil)
	if err != nil {
		t.Fatal(err)
	}
	wholeGPU := &allocator.Request{Sharing: gpu.ModeAuto, Containers: []allocator.Container{{Name: "claim", Count: 1, Whole: true}}}
	view := draNode(t)
	view.Occupy(view.GPUs[1].UUID, 81920, 1000, gpu.ModeExclusive)
	view.Occupy(view.GPUs[2].UUID, 81920, 1000, gpu.ModeExclusive)
	c := &claimCycle{req: wholeGPU, alloc: a, views: map[string]*allocator.Node{"n1": view}}
	if st := heldForNominated(c, "n1"); st != nil {
		t.Fatalf("no one nominated: %v", st)
	}
	c.nominated = map[string][]nominatedPod{"n1": {{uid: "pre", req: wholeGPU}}}
	if st := heldForNominated(c, "n1"); st == nil || st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), "held for a preemptor") {
		t.Errorf("GPU 0 freed for a nominated preemptor: %v; want it held", st)
	}
	// A preemptor that does not fit yet (its victims still hold the GPU)
	// holds nothing.
	view.Occupy(view.GPUs[0].UUID, 81920, 1000, gpu.ModeExclusive)
	if st := heldForNominated(c, "n1"); st != nil {
		t.Errorf("victims still there: %v; want nothing held", st)
	}
}
