package allocator

import "github.com/tessera-gpu/tessera/pkg/gpu"

// Occupy counts on GPU uuid what one holder outside any pod assignment
// takes there — a DRA claim's device, whose pods the scheduler does not
// book: memMiB, coresPerMille, one tenant, in mode m. Like
// ForceAssignment it refuses nothing (the claim is allocated already; an
// over-full GPU only takes nothing more), and a GPU's mode stays the one
// it had. It reports whether the node has the GPU.
func (n *Node) Occupy(uuid string, memMiB int64, coresPerMille int, m gpu.SharingMode) bool {
	i := n.gpuByUUID(uuid)
	if i < 0 {
		return false
	}
	u := &n.GPUs[i].use
	u.mem += memMiB
	u.cores += int32(coresPerMille)
	u.tenants++
	if md, err := modeOf(m); err == nil && u.mode == modeNone {
		u.mode = md
	}
	n.Version++
	return true
}

// Rank orders n's GPUs for r, a request for one GPU (a DRA claim's
// device: one slice, or one whole GPU): the GPU the policy places r on
// first, then the one it would choose were that GPU gone, and so on; then
// the GPUs r fits nowhere by this account, in the node's order. Positions
// are in n.GPUs. score is the first placement's score, ok false where r
// fits no GPU of n. The node's DRA mark is ignored: claims are what a DRA
// node serves. n is not changed.
func (a *Allocator) Rank(n *Node, r *Request) (order []int, score float64, ok bool) {
	c := n.Clone()
	c.DRA = false
	var p Placement
	ranked := uint64(0)
	for range c.GPUs {
		if !a.Place(c, r, &p).OK() || len(p.Grants) == 0 {
			break
		}
		i := p.Grants[0].GPU
		if len(order) == 0 {
			score, ok = p.Score, true
		}
		order = append(order, i)
		ranked |= 1 << uint(i)
		c.GPUs[i].Healthy = false
	}
	for i := range c.GPUs {
		if ranked&(1<<uint(i)) == 0 {
			order = append(order, i)
		}
	}
	return order, score, ok
}
