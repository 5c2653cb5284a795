package dra

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func testInventory() *gpu.NodeInventory {
	return &gpu.NodeInventory{Node: "node-a", GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-0", Model: "H100", MemoryMiB: 81920, SMCount: 132, Healthy: true, MPSCapable: true, NVLinkPeers: []int{1}, Slices: 4,
			Isolation: &gpu.IsolationOffer{MPSLimits: true, Shim: true}},
		{Index: 1, UUID: "GPU-1", Model: "H100", MemoryMiB: 81920, Healthy: true, NVLinkPeers: []int{0},
			Isolation: &gpu.IsolationOffer{KernelMemoryLimits: true, Shim: true}},
		{Index: 2, UUID: "GPU-2", Model: "A100", MemoryMiB: 40960, Healthy: false, Slices: 2},
	}}
}

func TestResources(t *testing.T) {
	res := Resources(testInventory(), Policy{MinMemoryMiB: 4096, MemoryOversubscription: 1.5}, nil)
	pool, ok := res.Pools["node-a"]
	if !ok || len(res.Pools) != 1 || len(pool.Slices) != 1 {
		t.Fatalf("pools: %+v; want one pool named by the node, one slice", res.Pools)
	}
	devs := pool.Slices[0].Devices
	if len(devs) != 3 {
		t.Fatalf("%d devices, want one per GPU", len(devs))
	}
	str := func(d resourceapi.Device, name resourceapi.QualifiedName) string {
		if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return "<unset>"
	}
	capValue := func(d resourceapi.Device, name resourceapi.QualifiedName) string {
		c := d.Capacity[name]
		return c.Value.String()
	}
	for _, tc := range []struct {
		i                                    int
		name, uuid, sharing, memHeld, cpHeld string
		peers, memory, slices                string
		tainted                              bool
	}{
		// MPS: a claim is reported under the whole GPU's server limits
		// (they may rise before it connects), so the shim holds memory
		// and MPS's client limit compute.
		{0, "gpu-0", "GPU-0", "mps", "shim", "mps-client", "1", "120Gi", "4", false},
		// Time-sliced: the kernel limit holds a claim of one pod's memory,
		// the shim its compute. No adjuster limit: the cores bound the
		// claims.
		{1, "gpu-1", "GPU-1", "time-slicing", "kernel", "shim", "0", "120Gi", "100", false},
		{2, "gpu-2", "GPU-2", "time-slicing", "none", "none", "", "60Gi", "2", true},
	} {
		d := devs[tc.i]
		if d.Name != tc.name || str(d, "uuid") != tc.uuid || str(d, "sharing") != tc.sharing || str(d, "memoryIsolation") != tc.memHeld ||
			str(d, "computeIsolation") != tc.cpHeld || str(d, "nvlinkPeers") != tc.peers {
			t.Errorf("device %d: name %s uuid %s sharing %s memory %s compute %s peers %q; want %+v", tc.i, d.Name, str(d, "uuid"), str(d, "sharing"),
				str(d, "memoryIsolation"), str(d, "computeIsolation"), str(d, "nvlinkPeers"), tc)
		}
		if got := capValue(d, CapacityMemory); got != tc.memory {
			t.Errorf("device %d memory capacity %s, want %s (× the oversubscription)", tc.i, got, tc.memory)
		}
		if got := capValue(d, CapacitySlices); got != tc.slices {
			t.Errorf("device %d slices %s, want %s", tc.i, got, tc.slices)
		}
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("device %d does not allow multiple allocations", tc.i)
		}
		if tainted := len(d.Taints) == 1 && d.Taints[0].Key == TaintUnhealthy && d.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule; tainted != tc.tainted {
			t.Errorf("device %d taints %+v, want tainted %v", tc.i, d.Taints, tc.tainted)
		}
		mem := d.Capacity[CapacityMemory].RequestPolicy
		gpuMem := resource.NewQuantity(testInventory().GPUs[tc.i].MemoryMiB<<20, resource.BinarySI)
		if mem.Default.Cmp(*gpuMem) != 0 || mem.ValidRange.Max.Cmp(*gpuMem) != 0 || mem.ValidRange.Min.String() != "4Gi" {
			t.Errorf("device %d memory policy default %s range %s–%s; want the GPU's memory by default and at most, 4Gi at least",
				tc.i, mem.Default, mem.ValidRange.Min, mem.ValidRange.Max)
		}
		cores := d.Capacity[CapacityCores]
		if cores.Value.String() != "100" || cores.RequestPolicy.Default.String() != "100" || cores.RequestPolicy.ValidRange.Min.String() != "1" {
			t.Errorf("device %d cores %+v", tc.i, cores)
		}
		sl := d.Capacity[CapacitySlices].RequestPolicy
		if sl.Default.String() != "1" || len(sl.ValidValues) != 1 || sl.ValidValues[0].String() != "1" {
			t.Errorf("device %d slices policy %+v: every claim takes exactly one", tc.i, sl)
		}
	}
}

// TestResourcesLessHeld: what the device plugin's pods hold is taken off
// the capacities (a claim naming none takes the rest); a GPU with too
// little left for any claim is published whole and tainted.
func TestResourcesLessHeld(t *testing.T) {
	inv := testInventory()
	held := map[string]Held{
		"GPU-0": {MemoryMiB: 20480, CoresPerMille: 250, Containers: 1},
		"GPU-1": {MemoryMiB: 81920, CoresPerMille: 1000, Containers: 1},
	}
	devs := Resources(inv, Policy{MinMemoryMiB: 4096, MemoryOversubscription: 1}, held).Pools["node-a"].Slices[0].Devices
	q := func(d resourceapi.Device, name resourceapi.QualifiedName) (value, def, max string) {
		c := d.Capacity[name]
		def = c.RequestPolicy.Default.String()
		if c.RequestPolicy.ValidRange != nil {
			max = c.RequestPolicy.ValidRange.Max.String()
		}
		return c.Value.String(), def, max
	}
	for _, tc := range []struct {
		i                 int
		memory, cores, sl [3]string
		taints            []string
	}{
		{0, [3]string{"60Gi", "60Gi", "60Gi"}, [3]string{"75", "75", "75"}, [3]string{"3", "1", ""}, nil},
		{1, [3]string{"80Gi", "80Gi", "80Gi"}, [3]string{"100", "100", "100"}, [3]string{"99", "1", ""}, []string{TaintHeld}},
		{2, [3]string{"40Gi", "40Gi", "40Gi"}, [3]string{"100", "100", "100"}, [3]string{"2", "1", ""}, []string{TaintUnhealthy}},
	} {
		d := devs[tc.i]
		m1, m2, m3 := q(d, CapacityMemory)
		c1, c2, c3 := q(d, CapacityCores)
		s1, s2, s3 := q(d, CapacitySlices)
		var taints []string
		for _, x := range d.Taints {
			taints = append(taints, x.Key)
		}
		if [3]string{m1, m2, m3} != tc.memory || [3]string{c1, c2, c3} != tc.cores || [3]string{s1, s2, s3} != tc.sl || !slices.Equal(taints, tc.taints) {
			t.Errorf("device %d: memory %s/%s/%s cores %s/%s/%s slices %s/%s/%s taints %v; want %v %v %v %v (value/default/max)",
				tc.i, m1, m2, m3, c1, c2, c3, s1, s2, s3, taints, tc.memory, tc.cores, tc.sl, tc.taints)
		}
	}
}

func TestGrantOf(t *testing.T) {
	g := gpu.Device{Index: 3, UUID: "GPU-3", MemoryMiB: 40960, MPSCapable: true}
	for _, tc := range []struct {
		memory, cores string
		mode          gpu.SharingMode
		memMiB        int64
		perMille      int
		err           bool
	}{
		{"10Gi", "25", gpu.ModeMPS, 10240, 250, false},
		{"10000001", "1", gpu.ModeMPS, 10, 10, false}, // bytes, rounded up to MiB
		{"40Gi", "100", gpu.ModeExclusive, 40960, 1000, false},
		{"4Gi", "100", gpu.ModeExclusive, 40960, 1000, false}, // every core: the whole GPU
		{"41Gi", "50", "", 0, 0, true},
		{"0", "50", "", 0, 0, true},
		{"1Gi", "0", "", 0, 0, true},
		{"1Gi", "101", "", 0, 0, true},
	} {
		cores := resource.MustParse(tc.cores)
		mode, grant, err := grantOf(g, mebibytesUp(resource.MustParse(tc.memory)), cores.Value())
		if (err != nil) != tc.err || mode != tc.mode || grant.MemoryMiB != tc.memMiB || grant.CoresPerMille != tc.perMille {
			t.Errorf("grantOf(%s, %s) = %s %+v %v; want %s %d MiB %d‰ err %v", tc.memory, tc.cores, mode, grant, err, tc.mode, tc.memMiB, tc.perMille, tc.err)
		}
	}
	ts := gpu.Device{UUID: "GPU-4", MemoryMiB: 1024}
	if mode, _, _ := grantOf(ts, 512, 10); mode != gpu.ModeTimeSlicing {
		t.Errorf("a shared claim on a GPU without MPS: %s, want time-slicing", mode)
	}
}
