package allocator

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Grant is one GPU given to one container of a placement.
type Grant struct {
	// Container is the index of the container in Request.Containers.
	Container int
	// GPU is the position of the GPU in Node.GPUs.
	GPU       int
	MemoryMiB int64
	// Cores is per-mille of the GPU's SMs.
	Cores int
	mode  mode
}

// Mode is the sharing mode the container runs in on that GPU.
func (g Grant) Mode() gpu.SharingMode { return g.mode.public() }

// Placement is where a pod goes on one node, and how good that is.
type Placement struct {
	Grants []Grant
	// Score is the policy's score; higher is better. Scores compare across
	// nodes for the same request and allocator only.
	Score float64
}

// Allocator places requests on nodes under one configuration and policy. It
// is immutable, so one Allocator serves concurrent callers.
type Allocator struct {
	policy   config.Policy
	oversub  float64
	workload *Workload
}

// New returns an allocator for a validated configuration. The fgd and tessera
// policies score against w, the target workload; a nil w makes them fall back
// to best fit until a workload is known.
func New(cfg *config.AllocatorConfig, w *Workload) (*Allocator, error) {
	if !config.SimPolicy(cfg.Policy) {
		return nil, fmt.Errorf("%w: allocator.policy %q: want one of %v", gpu.ErrInvalid, cfg.Policy, config.Policies)
	}
	if cfg.MemoryOversubscription < 1 || cfg.MemoryOversubscription > config.MaxMemoryOversubscription {
		return nil, fmt.Errorf("%w: allocator.memoryOversubscription %v: must be between 1.0 and %.1f", gpu.ErrInvalid, cfg.MemoryOversubscription, config.MaxMemoryOversubscription)
	}
	if w != nil && len(w.shapes) == 0 {
		w = nil
	}
	return &Allocator{policy: cfg.Policy, oversub: cfg.MemoryOversubscription, workload: w}, nil
}

// Policy is the allocator's scoring policy.
func (a *Allocator) Policy() config.Policy { return a.policy }

// Fragmentation is n's expected fragmentation F_n(M) against the
// allocator's target workload, per-mille of a GPU: the free GPU compute on
// n that the workload's typical pods cannot use. ok is false without a
// workload (no GPU pod seen yet).
func (a *Allocator) Fragmentation(n *Node) (perMille float64, ok bool) {
	if a.workload == nil {
		return 0, false
	}
	return a.workload.Fragmentation(n, a.oversub), true
}

// WithWorkload returns an allocator like a scoring against w.
func (a *Allocator) WithWorkload(w *Workload) *Allocator {
	b := *a
	if w != nil && len(w.shapes) == 0 {
		w = nil
	}
	b.workload = w
	return &b
}

// Place decides whether r fits n and, if so, fills p with the chosen GPUs and
// the policy's score. It does not change n: call n.Apply(r, p) to book it.
// In steady state (p's slice grown once) it allocates nothing.
func (a *Allocator) Place(n *Node, r *Request, p *Placement) Reason {
	return a.place(n, r, p, nil)
}

// place is Place with an optional precomputed fragmentation state of n.
func (a *Allocator) place(n *Node, r *Request, p *Placement, st *fragState) Reason {
	p.Grants = p.Grants[:0]
	p.Score = 0
	if n.DRA && slices.ContainsFunc(r.Containers, func(c Container) bool { return c.Count > 0 }) {
		return Reason{Code: ServesDRA, GPU: -1}
	}
	cpuFree := n.CPUMilli - n.CPUUsed - r.CPUMilli
	if cpuFree < 0 {
		return Reason{Code: InsufficientCPU, Want: r.CPUMilli, Have: n.CPUMilli - n.CPUUsed, GPU: -1}
	}
	memFree := n.MemoryMiB - n.MemUsed - r.MemoryMiB
	if memFree < 0 {
		return Reason{Code: InsufficientMemory, Want: r.MemoryMiB, Have: n.MemoryMiB - n.MemUsed, GPU: -1}
	}
	var after [MaxGPUsPerNode]usage
	for i := range n.GPUs {
		after[i] = n.GPUs[i].use
	}
	var local fragState
	if st == nil && a.usesFrag() {
		a.workload.prepare(n, a.oversub, &local)
		st = &local
	}
	var taken uint64 // GPUs already given to this pod: its containers never share one
	// scored: the last slice chosen was scored on the final state, so its
	// score is the placement's (it includes the chosen GPU's own preference).
	scored := false
	for ci := range r.Containers {
		c := &r.Containers[ci]
		if c.Count == 0 {
			continue
		}
		if c.Whole {
			set, why := a.wholeGPUs(n, r, c, &after, taken)
			if !why.OK() {
				return why
			}
			for set != 0 {
				i := bits.TrailingZeros64(set)
				set &^= 1 << uint(i)
				g := &n.GPUs[i]
				p.Grants = append(p.Grants, Grant{Container: ci, GPU: i, MemoryMiB: g.MemoryMiB, Cores: gpu.CoresPerGPU, mode: modeExclusive})
				after[i] = usage{mem: g.MemoryMiB, cores: gpu.CoresPerGPU, tenants: 1, mode: modeExclusive}
				taken |= 1 << uint(i)
			}
			scored = false
			continue
		}
		for range c.Count {
			best, bestScore := -1, 0.0
			var bestMem, bestCores int64
			var bestMode mode
			for i := range n.GPUs {
				if taken&(1<<uint(i)) != 0 {
					continue
				}
				g := &n.GPUs[i]
				m, mem, cores, ok := sliceFits(r, c, g, after[i], a.oversub)
				if !ok {
					continue
				}
				saved := after[i]
				after[i] = usage{mem: saved.mem + mem, cores: saved.cores + int32(cores), tenants: saved.tenants + 1, mode: m}
				s := a.score(n, st, &after, taken|1<<uint(i), i, cpuFree, memFree)
				after[i] = saved
				if best < 0 || s > bestScore {
					best, bestScore, bestMem, bestCores, bestMode = i, s, mem, cores, m
				}
			}
			if best < 0 {
				return a.diagnose(n, r, c, &after, taken)
			}
			u := &after[best]
			*u = usage{mem: u.mem + bestMem, cores: u.cores + int32(bestCores), tenants: u.tenants + 1, mode: bestMode}
			taken |= 1 << uint(best)
			p.Grants = append(p.Grants, Grant{Container: ci, GPU: best, MemoryMiB: bestMem, Cores: int(bestCores), mode: bestMode})
			p.Score, scored = bestScore, true
		}
	}
	if !scored {
		p.Score = a.score(n, st, &after, taken, -1, cpuFree, memFree)
	}
	return Reason{}
}

// sliceFits reports whether a slice of c fits GPU g (with usage u), in which
// mode, and its resolved memory and cores.
func sliceFits(r *Request, c *Container, g *GPU, u usage, oversub float64) (mode, int64, int64, bool) {
	if !g.Healthy || !r.allows(g.Model) {
		return 0, 0, 0, false
	}
	m, ok := sliceMode(r.Sharing, g, u)
	if !ok || g.full(u) || (r.MemoryHard && !g.memoryHard(m)) {
		return 0, 0, 0, false
	}
	mem, cores := c.slice(g)
	if mem > g.MemoryMiB || cores > gpu.CoresPerGPU-int64(u.cores) || mem > g.memLimit(oversub)-u.mem {
		return 0, 0, 0, false
	}
	return m, mem, cores, true
}

// sliceMode is the decision order of DESIGN.md for one GPU: a pod that allows
// MPS runs as an MPS client on an MPS-capable GPU, otherwise time-sliced; a GPU
// already running a mode only takes tenants of that mode. A pod that insists
// on time-slicing never goes to an MPS-mode GPU: the agent keeps those in
// exclusive-process compute mode for their MPS daemon, where a second
// process outside MPS cannot open a context.
func sliceMode(sharing gpu.SharingMode, g *GPU, u usage) (mode, bool) {
	var want mode
	switch sharing {
	case gpu.ModeMPS:
		if !g.MPS {
			return 0, false
		}
		want = modeMPS
	case gpu.ModeTimeSlicing:
		if g.MPS {
			return 0, false
		}
		want = modeTimeSlicing
	default:
		want = modeTimeSlicing
		if g.MPS {
			want = modeMPS
		}
	}
	return want, u.mode == modeNone || u.mode == want
}

// memoryHard says whether a slice in mode m on g has its memory held by the
// kernel: only time-sliced slices on a GPU offering NVML cgroup limits. MPS
// slices are not, even there: which cgroup the driver charges for an MPS
// client's memory is not established (gpu.GuaranteeOf).
func (g *GPU) memoryHard(m mode) bool { return m == modeTimeSlicing && g.KernelMemory }

// wholeGPUs picks c.Count free GPUs: an NVLink-connected set when the node has
// topology and one exists, otherwise the lowest positions.
func (a *Allocator) wholeGPUs(n *Node, r *Request, c *Container, after *[MaxGPUsPerNode]usage, taken uint64) (uint64, Reason) {
	need := c.MemoryMiB
	if need < c.MinMemoryMiB {
		need = c.MinMemoryMiB
	}
	var free uint64
	allowed, healthy := false, false
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.Healthy {
			continue
		}
		healthy = true
		if !r.allows(g.Model) {
			continue
		}
		allowed = true
		if taken&(1<<uint(i)) == 0 && after[i].tenants == 0 && g.MemoryMiB >= need {
			free |= 1 << uint(i)
		}
	}
	switch {
	case !healthy:
		return 0, Reason{Code: NoHealthyGPU, GPU: -1}
	case !allowed:
		return 0, Reason{Code: NoAllowedModel, Models: r.Models, GPU: -1}
	case bits.OnesCount64(free) < c.Count:
		return 0, Reason{Code: NotEnoughWholeGPUs, Want: int64(c.Count), Have: int64(bits.OnesCount64(free)), GPU: -1}
	}
	if n.hasTopo && c.Count > 1 {
		if set := nvlinkClique(n, free, c.Count); set != 0 {
			return set, Reason{}
		}
	}
	var set uint64
	for k := 0; k < c.Count; k++ {
		i := bits.TrailingZeros64(free)
		free &^= 1 << uint(i)
		set |= 1 << uint(i)
	}
	return set, Reason{}
}

// nvlinkClique greedily grows, from each free GPU in order, a set of count
// free GPUs that are all NVLink peers of each other; 0 if none is found.
func nvlinkClique(n *Node, free uint64, count int) uint64 {
	for seeds := free; seeds != 0; {
		s := bits.TrailingZeros64(seeds)
		seeds &^= 1 << uint(s)
		set := uint64(1) << uint(s)
		cand := free & n.GPUs[s].peers
		for bits.OnesCount64(set) < count && cand != 0 {
			i := bits.TrailingZeros64(cand)
			cand &^= 1 << uint(i)
			cand &= n.GPUs[i].peers
			set |= 1 << uint(i)
		}
		if bits.OnesCount64(set) == count {
			return set
		}
	}
	return 0
}

// diagnose explains why no GPU takes a slice of c. It is off the hot path.
func (a *Allocator) diagnose(n *Node, r *Request, c *Container, after *[MaxGPUsPerNode]usage, taken uint64) Reason {
	why := Reason{Code: NoFragment, GPU: -1}
	healthy, allowed, mps, plain, hard, conflict := false, false, false, false, false, -1
	full, fullCap := -1, 0
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.Healthy {
			continue
		}
		healthy = true
		if !r.allows(g.Model) {
			continue
		}
		allowed = true
		mps = mps || g.MPS
		plain = plain || !g.MPS
		hard = hard || (!g.MPS && g.KernelMemory && r.Sharing != gpu.ModeMPS)
		if r.MemoryHard && (g.MPS || !g.KernelMemory) {
			continue
		}
		mem, cores := c.slice(g)
		why.Want, why.WantCores = mem, cores
		u := after[i]
		if taken&(1<<uint(i)) != 0 {
			continue
		}
		if g.full(u) {
			if full < 0 {
				full, fullCap = g.Index, g.MaxTenants
			}
			continue
		}
		if _, ok := sliceMode(r.Sharing, g, u); !ok {
			if conflict < 0 && gpu.CoresPerGPU-int64(u.cores) >= cores && u.mode != modeExclusive {
				conflict = g.Index
			}
			continue
		}
		freeMem := min(g.memLimit(a.oversub)-u.mem, g.MemoryMiB)
		if why.GPU < 0 || freeMem > why.Have {
			why.GPU, why.Have, why.HaveCores = g.Index, freeMem, gpu.CoresPerGPU-int64(u.cores)
		}
	}
	switch {
	case !healthy:
		return Reason{Code: NoHealthyGPU, GPU: -1}
	case !allowed:
		return Reason{Code: NoAllowedModel, Models: r.Models, GPU: -1}
	case r.Sharing == gpu.ModeMPS && !mps:
		return Reason{Code: NoMPS, GPU: -1}
	case r.Sharing == gpu.ModeTimeSlicing && !plain:
		return Reason{Code: NoTimeSlicing, GPU: -1}
	case r.MemoryHard && !hard:
		return Reason{Code: NoHardMemory, GPU: -1}
	case why.GPU < 0 && full >= 0:
		return Reason{Code: SlicesFull, GPU: full, Have: int64(fullCap)}
	case why.GPU < 0 && conflict >= 0:
		return Reason{Code: ModeConflict, GPU: conflict}
	}
	return why
}

// Choose places r on the best of nodes: the highest score, ties to the earliest
// node. It returns the node's position, or -1 when none fits.
func (a *Allocator) Choose(nodes []*Node, r *Request, p *Placement) int {
	best := -1
	var cand Placement
	for i, n := range nodes {
		if !a.Place(n, r, &cand).OK() {
			continue
		}
		if best < 0 || cand.Score > p.Score {
			best = i
			p.Grants, cand.Grants = cand.Grants, p.Grants
			p.Score = cand.Score
		}
	}
	return best
}

// Explain says why r fits none of nodes, for the pod's status.
func (a *Allocator) Explain(nodes []*Node, r *Request) string {
	reasons := make([]NodeReason, len(nodes))
	var p Placement
	for i, n := range nodes {
		reasons[i] = NodeReason{n.Name, a.Place(n, r, &p)}
	}
	return Summarize(reasons)
}
