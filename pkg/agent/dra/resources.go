// Package dra is the agent's Dynamic Resource Allocation driver,
// gpu.tessera.dev: it publishes the node's GPUs as devices of a
// ResourceSlice, with consumable capacity (memory, cores, slices), and
// prepares the claims allocated on them with the same CDI edits and limits
// the device plugin gives (pkg/agent/deviceplugin). Resources is the pure
// part (inventory in, devices out); Driver does the file work behind
// kubelet's DRA manager, through k8s.io/dynamic-resource-allocation's
// kubeletplugin helper.
package dra

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// DriverName is the DRA driver's name: the domain of its attributes and
// capacities, and what DeviceClasses select.
const DriverName = gpu.DRADriver

// The consumable capacities of a GPU device.
const (
	// CapacityMemory is GPU memory, a binary quantity ("10Gi").
	CapacityMemory resourceapi.QualifiedName = gpu.DRAMemory
	// CapacityCores is the percentage (1–100) of the GPU's SMs.
	CapacityCores resourceapi.QualifiedName = gpu.DRACores
	// CapacitySlices counts the claims on the GPU: each takes one, and
	// the GPU has as many as the slice adjuster allows.
	CapacitySlices resourceapi.QualifiedName = "slices"
)

// TaintUnhealthy is the device taint of a GPU the agent found faulted
// (an Xid, lost from the bus): no new claim is allocated on it.
const TaintUnhealthy = DriverName + "/unhealthy"

// Policy is what the published request policies say, from the agent's
// configuration.
type Policy struct {
	// MinMemoryMiB is the smallest memory a claim may take (the smallest
	// workload class minimum): a smaller request is rounded up to it.
	MinMemoryMiB int64
	// MemoryOversubscription is the allocator's memory oversubscription:
	// a GPU's memory capacity is its memory times this, while no single
	// claim may take more than the GPU has.
	MemoryOversubscription float64
}

// unlimitedSlices is the slices capacity of a GPU the adjuster sets no
// limit on: every claim takes at least one percent of the cores, so no
// more can fit anyway.
const unlimitedSlices = 100

// TaintHeld is the device taint of a GPU the node's device-plugin pods
// leave too little of for any claim: a node moved to DRA keeps its running
// pods, and no claim is allocated over them.
const TaintHeld = DriverName + "/device-plugin-pods"

// Held is what pods placed through the device plugin hold of one GPU:
// their grants, summed. A node moved from the device plugin to DRA keeps
// those pods running, and offers claims only the rest.
type Held struct {
	MemoryMiB     int64
	CoresPerMille int
	Containers    int
}

// Resources is the node's pool: one ResourceSlice, named by the node, with
// a device per GPU. Every GPU allows many allocations; a claim that names
// no capacity takes the whole GPU (its memory and all its cores), or all
// that held (by UUID) leaves of it.
func Resources(inv *gpu.NodeInventory, p Policy, held map[string]Held) resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		devices = append(devices, device(g, p, held[g.UUID]))
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		inv.Node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

func mebibytes(n int64) resource.Quantity { return *resource.NewQuantity(n<<20, resource.BinarySI) }

func count(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }

func device(g gpu.Device, p Policy, h Held) resourceapi.Device {
	oversub := p.MemoryOversubscription
	if oversub < 1 {
		oversub = 1
	}
	total := int64(math.Floor(float64(g.MemoryMiB) * oversub))
	memCap := total
	minMem := min(max(p.MinMemoryMiB, 1), g.MemoryMiB)
	slices := int64(g.Slices)
	if slices <= 0 {
		slices = unlimitedSlices
	}
	// What the device plugin's pods leave: a claim may take at most the
	// rest, and takes the rest when it names no capacity.
	perClaim, cores := g.MemoryMiB, int64(100)
	full := false
	if h != (Held{}) {
		memCap -= h.MemoryMiB
		cores = int64(gpu.CoresPerGPU-h.CoresPerMille) * 100 / gpu.CoresPerGPU
		slices -= int64(h.Containers)
		perClaim = min(perClaim, memCap)
		if perClaim < minMem || cores < 1 || slices < 1 {
			// Nothing a claim could take: the GPU is published whole
			// (capacities must hold their policies) and tainted.
			full = true
			memCap, perClaim, cores, slices = total, g.MemoryMiB, 100, max(slices, 1)
		}
	}
	mode := gpu.ClaimMode(0, g.MPSCapable) // how a slice of it runs
	// What holds a slice of it for a claim of one pod, the usual claim (a
	// claim shared by several pods loses the kernel's memory limits).
	held := gpu.GuaranteeOf(mode, gpu.GPUGrant{}, gpu.ClaimOffer(g.Offer(), 1), gpu.MPSServerLimits{ThreadPercent: 100})
	peers := make([]string, len(g.NVLinkPeers))
	for i, n := range g.NVLinkPeers {
		peers[i] = strconv.Itoa(n)
	}
	d := resourceapi.Device{
		Name: gpu.DRADeviceName(g.Index),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"uuid":             {StringValue: ptr.To(g.UUID)},
			"model":            {StringValue: ptr.To(g.Model)},
			"index":            {IntValue: ptr.To(int64(g.Index))},
			"sharing":          {StringValue: ptr.To(string(mode))},
			"memoryIsolation":  {StringValue: ptr.To(string(held.Memory))},
			"computeIsolation": {StringValue: ptr.To(string(held.Compute))},
			"nvlinkPeers":      {StringValue: ptr.To(strings.Join(peers, ","))},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapacityMemory: {Value: mebibytes(memCap), RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default:    ptr.To(mebibytes(perClaim)),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(mebibytes(minMem)), Max: ptr.To(mebibytes(perClaim)), Step: ptr.To(mebibytes(1))},
			}},
			CapacityCores: {Value: count(cores), RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default:    ptr.To(count(cores)),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(count(1)), Max: ptr.To(count(cores)), Step: ptr.To(count(1))},
			}},
			CapacitySlices: {Value: count(slices), RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default:     ptr.To(count(1)),
				ValidValues: []resource.Quantity{count(1)},
			}},
		},
		AllowMultipleAllocations: ptr.To(true),
	}
	if g.SMCount > 0 {
		d.Attributes["smCount"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.SMCount))}
	}
	if !g.Healthy {
		d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: TaintUnhealthy, Value: "true", Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	if full {
		d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: TaintHeld, Value: "true", Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	return d
}

// mebibytesUp is a consumed memory in MiB, rounded up (gpu.MiBUp).
func mebibytesUp(q resource.Quantity) int64 { return gpu.MiBUp(q.Value()) }

// grantOf checks a consumed memory (MiB) and cores (percent) against g and
// turns them into a grant there (gpu.ClaimGrant).
func grantOf(g gpu.Device, memMiB, pct int64) (gpu.SharingMode, gpu.GPUGrant, error) {
	switch {
	case memMiB <= 0 || memMiB > g.MemoryMiB:
		return "", gpu.GPUGrant{}, fmt.Errorf("memory %d MiB is not within GPU %s's %d MiB", memMiB, g.UUID, g.MemoryMiB)
	case pct < 1 || pct > 100:
		return "", gpu.GPUGrant{}, fmt.Errorf("cores %d is not a percentage from 1 to 100", pct)
	}
	mode, grant := gpu.ClaimGrant(g, memMiB, pct)
	return mode, grant, nil
}
