package allocator

import (
	"fmt"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// MaxGPUsPerNode bounds the GPUs of one node: NVLink peer sets are bitmasks and
// scratch space lives on the stack so that placement never allocates.
const MaxGPUsPerNode = 64

// mode is a GPU's sharing mode, compactly.
type mode uint8

const (
	modeNone mode = iota
	modeExclusive
	modeMPS
	modeTimeSlicing
)

func (m mode) public() gpu.SharingMode {
	switch m {
	case modeExclusive:
		return gpu.ModeExclusive
	case modeMPS:
		return gpu.ModeMPS
	case modeTimeSlicing:
		return gpu.ModeTimeSlicing
	}
	return gpu.ModeNone
}

func modeOf(m gpu.SharingMode) (mode, error) {
	switch m {
	case gpu.ModeExclusive:
		return modeExclusive, nil
	case gpu.ModeMPS:
		return modeMPS, nil
	case gpu.ModeTimeSlicing:
		return modeTimeSlicing, nil
	}
	return modeNone, fmt.Errorf("%w: sharing mode %q cannot run on a GPU", gpu.ErrInvalid, m)
}

// usage is what is placed on one GPU.
type usage struct {
	mem     int64
	cores   int32 // per-mille
	tenants int32
	mode    mode
}

// GPU is one device of a node: its facts and its usage.
type GPU struct {
	Index     int
	UUID      string
	Model     string
	MemoryMiB int64
	MPS       bool
	Healthy   bool
	// KernelMemory: the driver holds slices' memory per cgroup (NVML
	// memory limits), so time-sliced slices here are memory-hard.
	KernelMemory bool
	// MaxTenants is the most slices the GPU takes (the agent's slice count);
	// 0: no limit. Placement honours it; recorded assignments are never
	// refused for it, so a lowered count never loses a running pod.
	MaxTenants int
	// peers is a bitmask over positions in Node.GPUs.
	peers uint64
	use   usage
}

// MemoryUsedMiB, CoresUsed (per-mille), Tenants and Mode report the GPU's usage.
func (g *GPU) MemoryUsedMiB() int64           { return g.use.mem }
func (g *GPU) CoresUsed() int                 { return int(g.use.cores) }
func (g *GPU) Tenants() int                   { return int(g.use.tenants) }
func (g *GPU) Mode() gpu.SharingMode          { return g.use.mode.public() }
func (g *GPU) full(u usage) bool              { return g.MaxTenants > 0 && int(u.tenants) >= g.MaxTenants }
func (g *GPU) freeCores() int64               { return gpu.CoresPerGPU - int64(g.use.cores) }
func (g *GPU) memLimit(oversub float64) int64 { return int64(float64(g.MemoryMiB) * oversub) }

// Node is a node's allocatable resources and what is placed on them. It is not
// safe for concurrent mutation; the scheduler snapshots, the simulator is serial.
type Node struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	CPUUsed   int64
	MemUsed   int64
	GPUs      []GPU
	// Version changes whenever the usage changes, so callers can cache per node.
	Version uint64
	// DRA: the node serves its GPUs through DRA claims (inventory DRA):
	// no GPU request is placed here (ServesDRA).
	DRA     bool
	hasTopo bool
}

// NewNode builds an empty node from an inventory.
func NewNode(inv *gpu.NodeInventory) (*Node, error) {
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	if len(inv.GPUs) > MaxGPUsPerNode {
		return nil, fmt.Errorf("%w: node %s has %d GPUs, more than the %d supported", gpu.ErrInvalid, inv.Node, len(inv.GPUs), MaxGPUsPerNode)
	}
	n := &Node{Name: inv.Node, CPUMilli: inv.CPUMilli, MemoryMiB: inv.MemoryMiB, GPUs: make([]GPU, len(inv.GPUs)), DRA: inv.DRA}
	pos := make(map[int]int, len(inv.GPUs))
	for i, d := range inv.GPUs {
		pos[d.Index] = i
		n.GPUs[i] = GPU{Index: d.Index, UUID: d.UUID, Model: d.Model, MemoryMiB: d.MemoryMiB, MPS: d.MPSCapable, Healthy: d.Healthy, MaxTenants: d.Slices,
			KernelMemory: d.Offer().KernelMemoryLimits}
	}
	for i, d := range inv.GPUs {
		for _, p := range d.NVLinkPeers {
			n.GPUs[i].peers |= 1 << uint(pos[p])
			n.hasTopo = true
		}
	}
	return n, nil
}

// Clone returns a deep copy, for snapshots.
func (n *Node) Clone() *Node {
	c := *n
	c.GPUs = append([]GPU(nil), n.GPUs...)
	return &c
}

// SetHealthy marks a GPU (by UUID) healthy or not. Placed work stays accounted.
func (n *Node) SetHealthy(uuid string, healthy bool) bool {
	for i := range n.GPUs {
		if n.GPUs[i].UUID == uuid {
			n.GPUs[i].Healthy = healthy
			n.Version++
			return true
		}
	}
	return false
}

// Apply books a placement made by Place on this node. The caller passes the
// same request Place was given.
func (n *Node) Apply(r *Request, p *Placement) {
	n.CPUUsed += r.CPUMilli
	n.MemUsed += r.MemoryMiB
	for _, gr := range p.Grants {
		u := &n.GPUs[gr.GPU].use
		u.mem += gr.MemoryMiB
		u.cores += int32(gr.Cores)
		u.tenants++
		u.mode = gr.mode
	}
	n.Version++
}

// Release undoes Apply.
func (n *Node) Release(r *Request, p *Placement) {
	n.CPUUsed -= r.CPUMilli
	n.MemUsed -= r.MemoryMiB
	for _, gr := range p.Grants {
		u := &n.GPUs[gr.GPU].use
		u.mem -= gr.MemoryMiB
		u.cores -= int32(gr.Cores)
		u.tenants--
		if u.tenants == 0 {
			u.mode = modeNone
		}
	}
	n.Version++
}

// AddAssignment books an assignment read back from the API server (scheduler
// restart, agent checkpoint). It refuses one that names an unknown GPU or would
// break a GPU's limits or mode, so a corrupted record is reported, not trusted.
func (n *Node) AddAssignment(a *gpu.PodAssignment, cpuMilli, memMiB int64, oversub float64) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Node != n.Name {
		return fmt.Errorf("%w: assignment is for node %s, not %s", gpu.ErrInvalid, a.Node, n.Name)
	}
	next := make([]usage, len(n.GPUs))
	for i := range n.GPUs {
		next[i] = n.GPUs[i].use
	}
	for _, c := range a.Containers {
		m, err := modeOf(c.Mode)
		if err != nil {
			return err
		}
		for _, g := range c.GPUs {
			i := n.gpuByUUID(g.UUID)
			if i < 0 {
				return fmt.Errorf("%w: assignment names GPU %s, which node %s does not have", gpu.ErrInvalid, g.UUID, n.Name)
			}
			u := &next[i]
			if u.mode != modeNone && (u.mode != m || m == modeExclusive) {
				return fmt.Errorf("%w: GPU %s already runs %s, cannot add %s", gpu.ErrInvalid, g.UUID, u.mode.public(), c.Mode)
			}
			u.mem += g.MemoryMiB
			u.cores += int32(g.CoresPerMille)
			u.tenants++
			u.mode = m
			if u.cores > gpu.CoresPerGPU || u.mem > n.GPUs[i].memLimit(oversub) {
				return fmt.Errorf("%w: GPU %s would hold %d‰ cores and %d MiB, over its limits", gpu.ErrInvalid, g.UUID, u.cores, u.mem)
			}
		}
	}
	for i := range n.GPUs {
		n.GPUs[i].use = next[i]
	}
	n.CPUUsed += cpuMilli
	n.MemUsed += memMiB
	n.Version++
	return nil
}

// ForceAssignment books an assignment that AddAssignment refuses because
// the node changed under it (a GPU smaller, fewer slices, one gone): the
// pod is running there, so its grants stay counted and the GPU is over-full
// — no placement finds room on it — until the pod leaves. Grants on GPUs the
// node no longer has count nowhere (RemoveAssignment skips them too). A
// GPU's mode stays the one it had.
func (n *Node) ForceAssignment(a *gpu.PodAssignment, cpuMilli, memMiB int64) {
	for _, c := range a.Containers {
		m, err := modeOf(c.Mode)
		for _, g := range c.GPUs {
			i := n.gpuByUUID(g.UUID)
			if i < 0 {
				continue
			}
			u := &n.GPUs[i].use
			u.mem += g.MemoryMiB
			u.cores += int32(g.CoresPerMille)
			u.tenants++
			if u.mode == modeNone && err == nil {
				u.mode = m
			}
		}
	}
	n.CPUUsed += cpuMilli
	n.MemUsed += memMiB
	n.Version++
}

// RemoveAssignment undoes AddAssignment.
func (n *Node) RemoveAssignment(a *gpu.PodAssignment, cpuMilli, memMiB int64) {
	for _, c := range a.Containers {
		for _, g := range c.GPUs {
			i := n.gpuByUUID(g.UUID)
			if i < 0 {
				continue
			}
			u := &n.GPUs[i].use
			u.mem -= g.MemoryMiB
			u.cores -= int32(g.CoresPerMille)
			u.tenants--
			if u.tenants <= 0 {
				*u = usage{}
			}
		}
	}
	n.CPUUsed -= cpuMilli
	n.MemUsed -= memMiB
	n.Version++
}

func (n *Node) gpuByUUID(uuid string) int {
	for i := range n.GPUs {
		if n.GPUs[i].UUID == uuid {
			return i
		}
	}
	return -1
}

// Assignment turns a placement on this node into the record the scheduler writes.
func (n *Node) Assignment(r *Request, p *Placement) *gpu.PodAssignment {
	a := &gpu.PodAssignment{Node: n.Name}
	for ci, c := range r.Containers {
		if c.Count == 0 {
			continue
		}
		ca := gpu.ContainerAssignment{Name: c.Name}
		for _, gr := range p.Grants {
			if gr.Container != ci {
				continue
			}
			g := &n.GPUs[gr.GPU]
			ca.Mode = gr.mode.public()
			ca.GPUs = append(ca.GPUs, gpu.GPUGrant{UUID: g.UUID, Index: g.Index, MemoryMiB: gr.MemoryMiB, CoresPerMille: gr.Cores})
		}
		a.Containers = append(a.Containers, ca)
	}
	return a
}

// GPUCapacity is the node's healthy GPU compute in per-mille (1000 per GPU).
func (n *Node) GPUCapacity() int64 {
	var c int64
	for i := range n.GPUs {
		if n.GPUs[i].Healthy {
			c += gpu.CoresPerGPU
		}
	}
	return c
}

// GPUFree is the unallocated compute of the node's healthy GPUs, per-mille.
func (n *Node) GPUFree() int64 {
	var f int64
	for i := range n.GPUs {
		if n.GPUs[i].Healthy {
			f += n.GPUs[i].freeCores()
		}
	}
	return f
}
