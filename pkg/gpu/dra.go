package gpu

import (
	"strconv"
	"strings"
)

// DRADriver is Tessera's Dynamic Resource Allocation driver: the agent
// publishes a node's GPUs as its devices, and a pod asks with a
// ResourceClaim instead of the extended resources.
const DRADriver = "gpu.tessera.dev"

// DRAMemory and DRACores are the consumable capacities of a DRA device:
// its memory (a binary quantity) and the percentage (1–100) of its SMs.
const (
	DRAMemory = "memory"
	DRACores  = "cores"
)

// MiBUp is a number of bytes in MiB, rounded up: a DRA claim's consumed
// memory becomes a limit, and a limit below what was allocated would take
// from the tenant.
func MiBUp(bytes int64) int64 { return (bytes + 1<<20 - 1) >> 20 }

// DRADeviceName is the device of the GPU with NVML index i in its node's
// pool (the pool is named by the node).
func DRADeviceName(index int) string { return "gpu-" + strconv.Itoa(index) }

// DRADeviceIndex is the NVML index DRADeviceName encoded, false for a
// name it did not write.
func DRADeviceIndex(name string) (int, bool) {
	// Read for every claim in every scheduling cycle: no allocation.
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok || rest == "" || len(rest) > 9 || (rest[0] == '0' && rest != "0") {
		return 0, false // not as DRADeviceName writes it
	}
	i := 0
	for _, c := range []byte(rest) {
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int(c-'0')
	}
	return i, true
}

// ClaimOffer is what holds a DRA claim's slice on a GPU with offer o, for
// a claim reserved for pods pods: the device plugin's offer where the claim
// has one pod, whose cgroup then takes the kernel's memory limits as a
// device-plugin pod's does; less the kernel's memory limits otherwise (a
// claim shared by several pods, or reserved for none yet, has no one
// cgroup to hold it, so the shim holds its memory where offered). An MPS
// claim's slice is reported held by the whole GPU's server limits
// (GuaranteeOf with ThreadPercent 100) whatever the server is given: the
// server's limits can rise between the claim's preparation and its
// container's first CUDA call, and the claim keeps what it connects under.
func ClaimOffer(o IsolationOffer, pods int) IsolationOffer {
	if o.KernelMemoryLimits && pods != 1 {
		o.KernelMemoryLimits = false
		o.Why = strings.TrimPrefix(o.Why+"; kernel memory limits: not set for a claim shared by several pods", "; ")
	}
	return o
}

// ClaimTenant is a DRA claim prepared on a node, as the node's isolation
// sees it: the claim's UID, the one pod it is reserved for ("" when shared
// or reserved for none) with its namespace, name and the containers given
// the claim (where the agent knew the pod), and what it holds (one
// container's assignment: every container given the claim shares it).
type ClaimTenant struct {
	Claim      string
	Pod        string
	Namespace  string
	PodName    string
	Containers []string
	Assignment ContainerAssignment
}

// ClaimMode is how a DRA claim that consumed coresPercent of a GPU runs
// there: a claim that took every core has the whole GPU; otherwise it is
// an MPS client where the GPU runs MPS, time-sliced elsewhere.
func ClaimMode(coresPercent int64, mpsCapable bool) SharingMode {
	switch {
	case coresPercent >= 100:
		return ModeExclusive
	case mpsCapable:
		return ModeMPS
	}
	return ModeTimeSlicing
}

// ClaimGrant is what a DRA claim that consumed memMiB and coresPercent of
// GPU d holds there, and how it runs: a claim that took every core has
// the whole GPU (its memory too), whatever memory it named.
func ClaimGrant(d Device, memMiB, coresPercent int64) (SharingMode, GPUGrant) {
	mode := ClaimMode(coresPercent, d.MPSCapable)
	if mode == ModeExclusive {
		memMiB, coresPercent = d.MemoryMiB, 100
	}
	return mode, GPUGrant{UUID: d.UUID, Index: d.Index, MemoryMiB: memMiB, CoresPerMille: int(coresPercent) * CoresPerGPU / 100}
}
