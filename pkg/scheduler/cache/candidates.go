package cache

import (
	"sort"

	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// CandidateSet is the nodes a request shape may be tried on: every node
// whose inventory could hold it were the node empty, and every node the
// plugin has seen without a usable inventory (Filter says why those take
// nothing, and notices one whose inventory is arriving). A node whose GPUs
// can never hold the shape — no MPS-capable GPU for an MPS slice, none large
// enough, fewer GPUs than asked, no GPU of the models allowed — is left out,
// so the framework does not visit it: on a cluster of MPS and time-sliced
// nodes, a slice pinned to one mode would visit every node of the other on
// each attempt.
type CandidateSet struct {
	// epoch is the cache's inventory epoch the set was built at.
	epoch uint64
	// Nodes is handed to the framework (PreFilterResult.NodeNames) and
	// never changed: a later epoch builds a new set. nil: no node is left
	// out.
	Nodes sets.Set[string]
	// Excluded are the nodes left out, by name, and why (the allocator's
	// reason on the empty node), for PostFilter's account.
	Excluded []ExcludedNode
	// Known is how many nodes the cache knew (with or without a usable
	// inventory): a snapshot holding more has nodes the plugin has not yet
	// seen, and is not restricted.
	Known int
}

// ExcludedNode is a node a CandidateSet leaves out, and why: the
// allocator's reason on the node were it empty.
type ExcludedNode struct {
	Name   string
	Reason allocator.Reason
}

// maxCandidateShapes bounds the shapes whose candidates are kept (each a
// set of up to every node's name); past it the memo starts over.
const maxCandidateShapes = 64

// Candidates returns the candidates for a request of the given shape,
// rebuilt when an inventory came, changed or left since they were built.
// Whether a shape fits an empty node depends only on the node's inventory
// and the request (and the cache's oversubscription), so it is memoized per
// node until the node's inventory changes.
func (c *Cache) Candidates(a *allocator.Allocator, shape Shape, r *allocator.Request) *CandidateSet {
	c.candMu.Lock()
	got := c.cands[shape]
	c.candMu.Unlock()
	if got != nil && got.epoch == c.inventoryEpoch.Load() {
		return got
	}
	built := c.buildCandidates(a, shape, r)
	c.candMu.Lock()
	defer c.candMu.Unlock()
	if c.cands == nil || len(c.cands) >= maxCandidateShapes {
		c.cands = map[Shape]*CandidateSet{}
	}
	c.cands[shape] = built
	return built
}

func (c *Cache) buildCandidates(a *allocator.Allocator, shape Shape, r *allocator.Request) *CandidateSet {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := &CandidateSet{epoch: c.inventoryEpoch.Load(), Known: len(c.nodes) + len(c.bare)}
	fits := make([]string, 0, len(c.nodes)+len(c.bare))
	for name, s := range c.nodes {
		if reason := s.fitsEmpty(a, shape, r); !reason.OK() {
			out.Excluded = append(out.Excluded, ExcludedNode{Name: name, Reason: reason})
			continue
		}
		fits = append(fits, name)
	}
	if len(out.Excluded) == 0 {
		return out
	}
	for name := range c.bare {
		fits = append(fits, name)
	}
	out.Nodes = sets.New(fits...)
	sort.Slice(out.Excluded, func(i, j int) bool { return out.Excluded[i].Name < out.Excluded[j].Name })
	return out
}

// fitsEmpty is the allocator's answer for the shape on the node without
// any booking, memoized for the node's inventory (a new inventory is a new
// nodeState).
func (s *nodeState) fitsEmpty(a *allocator.Allocator, shape Shape, r *allocator.Request) allocator.Reason {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason, ok := s.emptyFit[shape]; ok {
		return reason
	}
	var p allocator.Placement
	reason := a.Place(s.empty, r, &p)
	if s.emptyFit == nil {
		s.emptyFit = map[Shape]allocator.Reason{}
	}
	s.emptyFit[shape] = reason
	return reason
}

// SetBare records whether a node is known without a usable inventory (no
// annotation, or one that cannot be read): such nodes stay candidates.
func (c *Cache) SetBare(name string, bare bool) {
	c.mu.RLock()
	same := c.bare[name] == bare
	c.mu.RUnlock()
	if same {
		return // a bare node's every status update comes here
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bare[name] == bare {
		return
	}
	if bare {
		c.bare[name] = true
	} else {
		delete(c.bare, name)
	}
	c.inventoryEpoch.Add(1)
}

// InventoryBehind reports whether the scheduler's snapshot shows a node
// with an inventory annotation the cache has not applied (a readable one:
// unreadable says which the handler refused), under one read lock.
func (c *Cache) InventoryBehind(nodes []fwk.NodeInfo, unreadable func(node string) bool) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, n := range nodes {
		node := n.Node()
		if node == nil {
			continue
		}
		raw, has := node.Annotations[gpu.AnnotationInventory]
		if !has {
			continue
		}
		if s, ok := c.nodes[node.Name]; ok && s.raw == raw || !ok && unreadable(node.Name) {
			continue
		}
		return true
	}
	return false
}
