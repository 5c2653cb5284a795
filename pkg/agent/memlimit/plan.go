// Package memlimit holds every shared GPU's tenants to their memory grants
// with the driver's per-cgroup limits (NVML's nvmlDeviceSetMemoryLimits_v1),
// where the driver offers them: a tenant that ignores every variable it is
// given still cannot allocate past its grant, because the driver refuses.
//
// Limits go on the pod's cgroup, not each container's: kubelet creates the
// pod cgroup before any container of the pod, so the device plugin's
// PreStartContainer can set them before the container's first process runs,
// whereas a container's own cgroup does not exist until the runtime creates
// it (only an NRI plugin sees that moment, and only on runtimes with NRI
// enabled). The driver applies a cgroup's limit to its descendants; a pod's
// limit on a GPU is the sum of its containers' grants there (the allocator
// never gives two containers of one pod the same GPU, so in practice it is
// one container's grant).
//
// The rule (Plan) is pure; Limiter does the I/O: it finds pod cgroups under
// the cgroup root, sets a starting pod's limits, and reconciles every pod's
// limits with the rule — setting missing ones, updating soft limits as
// tenants come and go, and clearing those of pods that ended, including
// limits a crashed agent left behind.
package memlimit

import (
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Want is one pod's limits on one GPU, in bytes.
type Want struct {
	Soft, Hard uint64
}

// Key names one pod's hold on one GPU.
type Key struct {
	PodUID string
	GPU    string
}

// Pod is one active pod of the node (not finished) and its assignment.
type Pod struct {
	UID        string
	Assignment *gpu.PodAssignment
}

// Plan is the limits every active pod should have, per GPU, on the GPUs
// that offer kernel memory limits. Whole GPUs (exclusive) get none: the
// tenant owns all of the memory.
//
// Hard limit: the pod's grant on the GPU (the sum over its containers),
// never above the GPU's memory. Soft limit: what of the grant is physically
// guaranteed. While the grants of all the GPU's tenants fit its memory,
// that is the whole grant; when the scheduler oversubscribed the GPU
// (memoryOversubscription > 1), each tenant's guaranteed share is its grant
// scaled by memory/Σ grants, rounded down to a MiB — so the soft limits
// together never exceed the GPU, and under pressure the tenants above their
// share lose memory first.
func Plan(pods []Pod, gpus []gpu.Device) map[Key]Want {
	offers := make(map[string]int64, len(gpus)) // UUID → memory MiB, for GPUs offering limits
	for _, d := range gpus {
		if d.Offer().KernelMemoryLimits {
			offers[d.UUID] = d.MemoryMiB
		}
	}
	grantMiB := map[Key]int64{}
	totalMiB := map[string]int64{}
	for _, p := range pods {
		if p.Assignment == nil {
			continue
		}
		for _, c := range p.Assignment.Containers {
			if c.Mode == gpu.ModeExclusive {
				continue
			}
			for _, g := range c.GPUs {
				if _, ok := offers[g.UUID]; !ok {
					continue
				}
				grantMiB[Key{p.UID, g.UUID}] += g.MemoryMiB
				totalMiB[g.UUID] += g.MemoryMiB
			}
		}
	}
	out := make(map[Key]Want, len(grantMiB))
	for k, mib := range grantMiB {
		capMiB := offers[k.GPU]
		hard := min(mib, capMiB)
		soft := hard
		if t := totalMiB[k.GPU]; t > capMiB {
			soft = min(hard, mib*capMiB/t)
		}
		out[k] = Want{Soft: uint64(soft) << 20, Hard: uint64(hard) << 20}
	}
	return out
}

// ForPod is the plan's limits of one pod, per GPU.
func ForPod(plan map[Key]Want, uid string) map[string]Want {
	out := map[string]Want{}
	for k, w := range plan {
		if k.PodUID == uid {
			out[k.GPU] = w
		}
	}
	return out
}
