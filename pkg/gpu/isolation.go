package gpu

import (
	"fmt"
	"slices"
	"strings"
)

// AnnotationIsolation is the pod annotation by which a pod asks for an
// isolation floor: IsolationMemoryHard places its slices only where a
// kernel mechanism holds their memory.
const AnnotationIsolation = "tessera.dev/isolation"

// IsolationMemoryHard asks that the pod's GPU memory be enforced by the
// kernel (or that the pod get whole GPUs): a tenant that ignores every
// variable it is given still cannot allocate past its grant.
const IsolationMemoryHard = "memory-hard"

// ParseIsolation parses the tessera.dev/isolation annotation: empty (no
// floor) or memory-hard.
func ParseIsolation(s string) (memoryHard bool, err error) {
	switch strings.TrimSpace(s) {
	case "":
		return false, nil
	case IsolationMemoryHard:
		return true, nil
	}
	return false, invalidf("%s=%s: want %s (or no annotation)", AnnotationIsolation, Quote(s), IsolationMemoryHard)
}

// Mechanism is what holds one dimension (memory or compute) of a slice to
// its grant. The strongest comes first.
type Mechanism string

// Mechanisms, strongest first.
const (
	// MechanismDevice: the tenant has the whole GPU; there is nobody to be
	// isolated from.
	MechanismDevice Mechanism = "device"
	// MechanismKernel: NVML's per-cgroup memory limit on the tenant's pod
	// cgroup. The driver refuses allocations past it, whatever the tenant
	// does inside its container.
	MechanismKernel Mechanism = "kernel"
	// MechanismMPSServer: the MPS control daemon's limit for the GPU's
	// server, which every client gets unless it asks for less. It equals
	// this tenant's grant, so it holds against a tenant that clears its own
	// variables.
	MechanismMPSServer Mechanism = "mps-server"
	// MechanismShim: libtessera, loaded into the tenant's container through
	// a read-only /etc/ld.so.preload: it counts every allocation of CUDA's
	// driver API against the grant and throttles kernel launches to the
	// share. It holds against a tenant that clears its variables or
	// unsets LD_PRELOAD; not against one that goes around CUDA's driver
	// API (libtessera/README.md lists what it cannot stop).
	MechanismShim Mechanism = "shim"
	// MechanismMPSClient: the tenant's own CUDA_MPS_* variables. They hold
	// for cooperating clients only: a tenant that clears them gets the
	// server's limit, the largest grant among the GPU's tenants.
	MechanismMPSClient Mechanism = "mps-client"
	// MechanismNone: accounted by the scheduler, not enforced on the node.
	MechanismNone Mechanism = "none"
)

// Enforced says whether the mechanism holds against a tenant that does not
// cooperate: one that clears the variables it was given. The shim is
// enforced in that sense; only the kernel holds a tenant that bypasses
// CUDA's driver API, which is why memory-hard asks for the kernel.
func (m Mechanism) Enforced() bool {
	return m == MechanismDevice || m == MechanismKernel || m == MechanismMPSServer || m == MechanismShim
}

// IsolationOffer is what a GPU's driver offers to hold slices, as the agent
// found it (nvml.Client.Offer). It travels in the inventory, so the
// scheduler places memory-hard pods by it and `tessera top` shows it.
type IsolationOffer struct {
	// KernelMemoryLimits: NVML's per-cgroup memory limits
	// (nvmlDeviceSetMemoryLimits_v1) work on this GPU and node.
	KernelMemoryLimits bool `json:"kernelMemoryLimits,omitempty"`
	// MPSLimits: the GPU runs an MPS daemon, whose server limits (active
	// thread percentage, pinned device memory) the agent sets.
	MPSLimits bool `json:"mpsLimits,omitempty"`
	// TimeSliceClasses: the driver's time-slice length can be set
	// (nvidia-smi compute-policy).
	TimeSliceClasses bool `json:"timeSliceClasses,omitempty"`
	// Shim: the agent puts libtessera into the containers of slices
	// nothing stronger holds (time-sliced slices, MPS slices connected
	// under server limits above their grant).
	Shim bool `json:"shim,omitempty"`
	// Why says, for each mechanism not offered, what the agent found, for
	// operators (for example "NVML: Not Supported").
	Why string `json:"why,omitempty"`
}

// Guarantee is what holds each dimension of one slice.
type Guarantee struct {
	Memory  Mechanism `json:"memory"`
	Compute Mechanism `json:"compute"`
}

func (g Guarantee) String() string { return fmt.Sprintf("memory=%s,compute=%s", g.Memory, g.Compute) }

// MPSServerLimits are the limits an MPS control daemon gives its server:
// every client of the GPU gets them unless its own variables ask for less.
type MPSServerLimits struct {
	// ThreadPercent is the active thread percentage, 1–100.
	ThreadPercent int
	// MemoryMiB is the pinned device memory limit; 0 sets none.
	MemoryMiB int64
}

// MPSServerLimitsFor is the tightest server limit still correct for a GPU's
// MPS tenants: the largest grant of each dimension, since the server's limit
// is each client's ceiling and no tenant may be held below its grant. With no
// tenant it is the whole GPU's threads and no memory limit (nothing to hold).
func MPSServerLimitsFor(grants []GPUGrant) MPSServerLimits {
	var l MPSServerLimits
	for _, g := range grants {
		l.ThreadPercent = max(l.ThreadPercent, g.CoresPercent())
		l.MemoryMiB = max(l.MemoryMiB, g.MemoryMiB)
	}
	if l.ThreadPercent == 0 {
		l.ThreadPercent = 100
	}
	return l
}

// GuaranteeOf is what holds a slice given the GPU's offer: mode is the
// slice's sharing mode, grant what it got on the GPU, and server the MPS
// server limits in force on the GPU (used for MPS slices only). Each
// dimension gets the strongest mechanism offered: the kernel's memory
// limit, else the shim, for time-sliced memory; the shim for time-sliced
// compute; the MPS server's limits where they are the grant, else the
// shim for MPS memory (MPS's own thread percentage, mps-client, for
// compute: the shim does not throttle MPS clients).
//
// Memory on MPS slices is not claimed as kernel-enforced even where the
// kernel limit is offered and set: MPS clients' memory may be charged to
// the server's cgroup rather than the client's, and until a GPU check has
// measured which, Tessera claims only what MPS itself holds.
func GuaranteeOf(mode SharingMode, grant GPUGrant, offer IsolationOffer, server MPSServerLimits) Guarantee {
	shimOr := func(m Mechanism) Mechanism {
		if offer.Shim {
			return MechanismShim
		}
		return m
	}
	switch mode {
	case ModeExclusive:
		return Guarantee{Memory: MechanismDevice, Compute: MechanismDevice}
	case ModeMPS:
		if !offer.MPSLimits {
			return Guarantee{Memory: shimOr(MechanismNone), Compute: MechanismNone}
		}
		g := Guarantee{Memory: shimOr(MechanismMPSClient), Compute: MechanismMPSClient}
		if server.MemoryMiB > 0 && server.MemoryMiB <= grant.MemoryMiB {
			g.Memory = MechanismMPSServer
		}
		if server.ThreadPercent <= grant.CoresPercent() {
			g.Compute = MechanismMPSServer
		}
		return g
	case ModeTimeSlicing:
		g := Guarantee{Memory: shimOr(MechanismNone), Compute: shimOr(MechanismNone)}
		if offer.KernelMemoryLimits {
			g.Memory = MechanismKernel
		}
		return g
	}
	return Guarantee{Memory: MechanismNone, Compute: MechanismNone}
}

// NeedsShim says whether any of a container's slices is held by the shim:
// then the agent loads libtessera into it.
func NeedsShim(gs []Guarantee) bool {
	for _, g := range gs {
		if g.Memory == MechanismShim || g.Compute == MechanismShim {
			return true
		}
	}
	return false
}

// ConditionIsolation is the type of the pod condition in which the node
// agent records, when a GPU container starts, what holds each of the pod's
// slices (FormatSliceGuarantees in its message).
const ConditionIsolation = "tessera.dev/GPUIsolation"

// SliceGuarantee is what holds one container's slice of one GPU.
type SliceGuarantee struct {
	Container string
	GPU       string
	Guarantee
}

// FormatSliceGuarantees is the agent's record of what held a pod's slices
// when its containers started, as the pod's GPUIsolation condition carries
// it: "main on GPU-…: memory=kernel,compute=none; …", sorted.
func FormatSliceGuarantees(gs []SliceGuarantee) string {
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = fmt.Sprintf("%s on %s: %s", g.Container, g.GPU, g.Guarantee)
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// ParseSliceGuarantees reads FormatSliceGuarantees' text back; anything
// after it in parentheses (an explanation for people) is ignored.
func ParseSliceGuarantees(s string) ([]SliceGuarantee, error) {
	if i := strings.Index(s, " ("); i >= 0 {
		s = s[:i]
	}
	var out []SliceGuarantee
	for _, part := range strings.Split(s, "; ") {
		if part == "" {
			continue
		}
		who, held, ok := strings.Cut(part, ": ")
		container, uuid, ok2 := strings.Cut(who, " on ")
		if !ok || !ok2 || container == "" || uuid == "" {
			return nil, invalidf("slice guarantee %s: want \"<container> on <GPU>: memory=…,compute=…\"", Quote(part))
		}
		var g Guarantee
		for _, kv := range strings.Split(held, ",") {
			k, v, _ := strings.Cut(kv, "=")
			m := Mechanism(v)
			if !m.known() {
				return nil, invalidf("slice guarantee %s: unknown mechanism %s", Quote(part), Quote(v))
			}
			switch k {
			case "memory":
				g.Memory = m
			case "compute":
				g.Compute = m
			default:
				return nil, invalidf("slice guarantee %s: unknown dimension %s", Quote(part), Quote(k))
			}
		}
		if g.Memory == "" || g.Compute == "" {
			return nil, invalidf("slice guarantee %s: want both memory and compute", Quote(part))
		}
		out = append(out, SliceGuarantee{Container: container, GPU: uuid, Guarantee: g})
	}
	return out, nil
}

func (m Mechanism) known() bool {
	switch m {
	case MechanismDevice, MechanismKernel, MechanismMPSServer, MechanismShim, MechanismMPSClient, MechanismNone:
		return true
	}
	return false
}
