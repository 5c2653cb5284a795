package allocator

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

var models = []string{"A100", "H100", "T4"}

func randomInventory(rng *rand.Rand, name string) *gpu.NodeInventory {
	inv := &gpu.NodeInventory{Node: name, CPUMilli: 1000 * rng.Int64N(129), MemoryMiB: 1024 * rng.Int64N(1025)}
	count := rng.IntN(9)
	model := models[rng.IntN(len(models))]
	mem := []int64{16384, 40960, 81920, 144384}[rng.IntN(4)]
	for i := range count {
		d := gpu.Device{Index: i, UUID: fmt.Sprintf("%s-%d", name, i), Model: model, MemoryMiB: mem,
			Healthy: rng.IntN(10) > 0, MPSCapable: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			for j := range count {
				if j != i && j/2 == i/2 {
					d.NVLinkPeers = append(d.NVLinkPeers, j)
				}
			}
		}
		inv.GPUs = append(inv.GPUs, d)
	}
	return inv
}

// randomRequest draws a request of the shapes podgpu.Request produces:
// whole GPUs, slices sized by memory, cores or both, in every sharing mode
// and workload class.
func randomRequest(rng *rand.Rand) *Request {
	r := &Request{CPUMilli: 500 * rng.Int64N(33), MemoryMiB: 1024 * rng.Int64N(65)}
	modes := []gpu.SharingMode{gpu.ModeAuto, gpu.ModeAuto, gpu.ModeMPS, gpu.ModeTimeSlicing, gpu.ModeExclusive}
	r.Sharing = modes[rng.IntN(len(modes))]
	minMem := []int64{0, config.DefaultMinSliceTrainingMiB, config.DefaultMinSliceInferenceMiB}[rng.IntN(3)]
	if rng.IntN(5) == 0 {
		r.Models = []string{models[rng.IntN(len(models))]}
	}
	sliced := r.Sharing == gpu.ModeMPS || r.Sharing == gpu.ModeTimeSlicing
	for c := range 1 + rng.IntN(2) {
		cr := Container{Name: fmt.Sprintf("c%d", c), MinMemoryMiB: minMem}
		switch rng.IntN(4) {
		case 0: // CPU only
		case 1: // whole GPUs, or a fifth of each in a sharing mode that needs a size
			cr.Count = 1 + rng.IntN(4)
			if sliced {
				cr.Cores = 200
			}
		default: // a slice
			cr.Count = 1 + rng.IntN(2)
			cr.MemoryMiB = 1024 * rng.Int64N(48)
			cr.Cores = rng.IntN(101) * gpu.CoresPerGPU / 100
			if cr.MemoryMiB == 0 && cr.Cores == 0 {
				cr.Cores = 100
			}
		}
		cr.Whole = cr.Count > 0 && ((cr.MemoryMiB == 0 && cr.Cores == 0) || r.Sharing == gpu.ModeExclusive)
		r.Containers = append(r.Containers, cr)
	}
	return r
}

type placed struct {
	node int
	req  *Request
	p    Placement
}

// checkInvariants recomputes every GPU's usage from the live placements and
// checks it against the node and against DESIGN.md's invariants.
func checkInvariants(t *testing.T, nodes []*Node, live []placed, oversub float64) {
	t.Helper()
	want := make([][]usage, len(nodes))
	cpu := make([]int64, len(nodes))
	mem := make([]int64, len(nodes))
	for i, n := range nodes {
		want[i] = make([]usage, len(n.GPUs))
	}
	for _, pl := range live {
		cpu[pl.node] += pl.req.CPUMilli
		mem[pl.node] += pl.req.MemoryMiB
		for _, g := range pl.p.Grants {
			u := &want[pl.node][g.GPU]
			u.mem += g.MemoryMiB
			u.cores += int32(g.Cores)
			u.tenants++
			if u.mode != modeNone && u.mode != g.mode {
				t.Fatalf("node %d GPU %d runs %v and %v at once", pl.node, g.GPU, u.mode.public(), g.mode.public())
			}
			u.mode = g.mode
		}
	}
	for i, n := range nodes {
		if n.CPUUsed != cpu[i] || n.MemUsed != mem[i] || n.CPUUsed > n.CPUMilli || n.MemUsed > n.MemoryMiB {
			t.Fatalf("node %d: cpu %d/%d (ledger %d), mem %d/%d (ledger %d)", i, n.CPUUsed, n.CPUMilli, cpu[i], n.MemUsed, n.MemoryMiB, mem[i])
		}
		for j := range n.GPUs {
			g := &n.GPUs[j]
			if g.use != want[i][j] {
				t.Fatalf("node %d GPU %d: usage %+v, ledger says %+v", i, j, g.use, want[i][j])
			}
			if g.use.cores > gpu.CoresPerGPU {
				t.Fatalf("node %d GPU %d: %d‰ cores, compute oversubscribed", i, j, g.use.cores)
			}
			if g.use.mem > g.memLimit(oversub) {
				t.Fatalf("node %d GPU %d: %d MiB of %d × %.1f", i, j, g.use.mem, g.MemoryMiB, oversub)
			}
			if g.use.mode == modeExclusive && g.use.tenants != 1 {
				t.Fatalf("node %d GPU %d: exclusive with %d owners", i, j, g.use.tenants)
			}
		}
	}
}

// oracleFits says, independently of the allocator's search, whether a request
// with one container (at most one GPU if sharing) fits a node.
func oracleFits(n *Node, r *Request, oversub float64) (bool, bool) {
	if len(r.Containers) != 1 || (!r.Containers[0].Whole && r.Containers[0].Count > 1) {
		return false, false // not decidable by this simple oracle
	}
	if n.CPUMilli-n.CPUUsed < r.CPUMilli || n.MemoryMiB-n.MemUsed < r.MemoryMiB {
		return false, true
	}
	c := &r.Containers[0]
	if c.Count == 0 {
		return true, true
	}
	fits := 0
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.Healthy || !r.allows(g.Model) {
			continue
		}
		if c.Whole {
			if g.use.tenants == 0 && g.MemoryMiB >= max(c.MemoryMiB, c.MinMemoryMiB) {
				fits++
			}
			continue
		}
		mode := modeTimeSlicing
		if r.Sharing == gpu.ModeMPS || (r.Sharing == gpu.ModeAuto && g.MPS) {
			mode = modeMPS
		}
		if (r.Sharing == gpu.ModeMPS && !g.MPS) || (r.Sharing == gpu.ModeTimeSlicing && g.MPS) {
			continue
		}
		if g.use.mode != modeNone && g.use.mode != mode {
			continue
		}
		m, co := c.slice(g)
		if m <= g.MemoryMiB && g.use.mem+m <= g.memLimit(oversub) && int64(g.use.cores)+co <= gpu.CoresPerGPU {
			fits++
		}
	}
	return fits >= c.Count, true
}

// TestInvariantsUnderRandomLoad places and releases thousands of random
// requests on random inventories under every policy and checks, after every
// step, DESIGN.md's invariants and that nothing the oracle can place is refused.
func TestInvariantsUnderRandomLoad(t *testing.T) {
	for _, policy := range config.Policies {
		t.Run(string(policy), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(len(policy))))
			cfg := config.Default().Allocator
			cfg.Policy = policy
			for round := range 20 {
				oversub := []float64{1.0, 1.25, 1.5}[round%3]
				cfg.MemoryOversubscription = oversub
				var counts []ShapeCount
				for range 10 {
					r := checked(t, randomRequest(rng))
					counts = append(counts, ShapeCount{Request: r, Count: float64(1 + rng.IntN(20))})
				}
				w, err := NewWorkload(counts, 0.95)
				if err != nil {
					t.Fatal(err)
				}
				a, err := New(&cfg, w)
				if err != nil {
					t.Fatal(err)
				}
				// other scores against a different workload: where a request's
				// fit ignores the workload, its answer must not move.
				for i := range counts {
					counts[i].Count = float64(1 + rng.IntN(20))
				}
				counts[0].Request = checked(t, randomRequest(rng))
				w2, err := NewWorkload(counts, 0.8)
				if err != nil {
					t.Fatal(err)
				}
				other := a.WithWorkload(w2)
				nodes := make([]*Node, 1+rng.IntN(6))
				for i := range nodes {
					if nodes[i], err = NewNode(randomInventory(rng, fmt.Sprintf("n%d", i))); err != nil {
						t.Fatal(err)
					}
				}
				var live []placed
				for step := range 300 {
					if len(live) > 0 && rng.IntN(3) == 0 {
						k := rng.IntN(len(live))
						nodes[live[k].node].Release(live[k].req, &live[k].p)
						live = append(live[:k], live[k+1:]...)
						checkInvariants(t, nodes, live, oversub)
						continue
					}
					req := checked(t, randomRequest(rng))
					for ni, n := range nodes {
						var p, again Placement
						why := a.Place(n, req, &p)
						a.Place(n, req, &again)
						if diff := cmp.Diff(p, again, cmp.AllowUnexported(Grant{})); diff != "" {
							t.Fatalf("round %d step %d: Place is not deterministic:\n%s", round, step, diff)
						}
						if req.FitIgnoresWorkload() {
							var q Placement
							if diff := cmp.Diff(why, other.Place(n, req, &q)); diff != "" {
								t.Fatalf("round %d step %d node %d: %s fits differently under another workload:\n%s", round, step, ni, req.Key(), diff)
							}
						}
						if want, known := oracleFits(n, req, oversub); known && want != why.OK() {
							t.Fatalf("round %d step %d node %d: Place says %v, oracle says fits=%v for %s", round, step, ni, why, want, req.Key())
						}
					}
					var p Placement
					if best := a.Choose(nodes, req, &p); best >= 0 {
						checkGrants(t, nodes[best], req, &p)
						nodes[best].Apply(req, &p)
						live = append(live, placed{best, req, Placement{Grants: append([]Grant(nil), p.Grants...)}})
					}
					checkInvariants(t, nodes, live, oversub)
				}
			}
		})
	}
}

func checkGrants(t *testing.T, n *Node, r *Request, p *Placement) {
	t.Helper()
	seen := map[int]bool{}
	perContainer := map[int]int{}
	for _, g := range p.Grants {
		if seen[g.GPU] {
			t.Fatalf("GPU %d granted twice to one pod", g.GPU)
		}
		seen[g.GPU] = true
		perContainer[g.Container]++
		d := &n.GPUs[g.GPU]
		if !d.Healthy || !r.allows(d.Model) {
			t.Fatalf("granted GPU %d: healthy=%v model %s, allowed %v", g.GPU, d.Healthy, d.Model, r.Models)
		}
		c := r.Containers[g.Container]
		if c.Whole && (g.mode != modeExclusive || g.Cores != gpu.CoresPerGPU || g.MemoryMiB != d.MemoryMiB) {
			t.Fatalf("whole container got %+v", g)
		}
		if !c.Whole && g.MemoryMiB < c.MinMemoryMiB {
			t.Fatalf("slice of %d MiB under the minimum %d", g.MemoryMiB, c.MinMemoryMiB)
		}
	}
	for i, c := range r.Containers {
		if perContainer[i] != c.Count {
			t.Fatalf("container %d got %d GPUs, asked %d", i, perContainer[i], c.Count)
		}
	}
}
