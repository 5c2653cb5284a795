package scheduler

import (
	"sort"

	"k8s.io/apimachinery/pkg/util/sets"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// candidates are the nodes a request shape may be tried on: every node
// whose inventory could hold it were the node empty, and every node the
// plugin has seen without a usable inventory (Filter says why those take
// nothing, and notices one whose inventory is arriving). A node whose GPUs
// can never hold the shape — no MPS-capable GPU for an MPS slice, none large
// enough, fewer GPUs than asked, no GPU of the models allowed — is left out,
// so the framework does not visit it: on a cluster of MPS and time-sliced
// nodes, a slice pinned to one mode visited every node of the other on each
// attempt, the largest difference in work between a Tessera pod's cycle and
// a plain one's at 1,000 nodes.
type candidates struct {
	// epoch is the cache's inventory epoch the set was built at.
	epoch uint64
	// nodes is handed to the framework (PreFilterResult.NodeNames) and
	// never changed: a later epoch builds a new set. nil: no node is left
	// out.
	nodes sets.Set[string]
	// excluded are the nodes left out, by name, and why (the allocator's
	// reason on the empty node), for PostFilter's account.
	excluded []excludedNode
	// known is how many nodes the cache knew (with or without a usable
	// inventory): a snapshot holding more has nodes the plugin has not yet
	// seen, and is not restricted.
	known int
}

type excludedNode struct {
	name   string
	reason allocator.Reason
}

// maxCandidateShapes bounds the shapes whose candidates are kept (each a
// set of up to every node's name); past it the memo starts over.
const maxCandidateShapes = 64

// Candidates returns the candidates for a request of the given shape,
// rebuilt when an inventory came, changed or left since they were built.
// Whether a shape fits an empty node depends only on the node's inventory
// and the request (and the cache's oversubscription), so it is memoized per
// node until the node's inventory changes.
func (c *Cache) Candidates(a *allocator.Allocator, shape Shape, r *allocator.Request) *candidates {
	c.candMu.Lock()
	got := c.cands[shape]
	c.candMu.Unlock()
	if got != nil && got.epoch == c.epoch.Load() {
		return got
	}
	built := c.buildCandidates(a, shape, r)
	c.candMu.Lock()
	defer c.candMu.Unlock()
	if c.cands == nil || len(c.cands) >= maxCandidateShapes {
		c.cands = map[Shape]*candidates{}
	}
	c.cands[shape] = built
	return built
}

func (c *Cache) buildCandidates(a *allocator.Allocator, shape Shape, r *allocator.Request) *candidates {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := &candidates{epoch: c.epoch.Load(), known: len(c.nodes) + len(c.bare)}
	fits := make([]string, 0, len(c.nodes)+len(c.bare))
	for name, s := range c.nodes {
		if reason := s.fitsEmpty(a, shape, r); !reason.OK() {
			out.excluded = append(out.excluded, excludedNode{name: name, reason: reason})
			continue
		}
		fits = append(fits, name)
	}
	if len(out.excluded) == 0 {
		return out
	}
	for name := range c.bare {
		fits = append(fits, name)
	}
	out.nodes = sets.New(fits...)
	sort.Slice(out.excluded, func(i, j int) bool { return out.excluded[i].name < out.excluded[j].name })
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
	c.epoch.Add(1)
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

// narrowsSearch reports whether handing the framework candidates of the
// cluster's all nodes leaves it less to do. Its adaptive
// percentageOfNodesToScore (the default) stops filtering after a share of
// the nodes it was given that shrinks as that number grows, so a smaller set
// can raise how many nodes must pass and be scored: at 5,000 nodes, half of
// them as candidates means 750 to find instead of 500, and the rejected half
// cost less to visit than the extra 250 to score. This is the framework's
// count (schedule_one.go, numFeasibleNodesToFind) with the profile's
// percentage where the plugin can see it; a percentage set only globally is
// not visible here, and the default is assumed.
func narrowsSearch(candidates, all int, percentage *int32) bool {
	return feasibleToFind(candidates, percentage) <= feasibleToFind(all, percentage)
}

func feasibleToFind(nodes int, percentage *int32) int {
	const minNodes, minPercentage = 100, 5
	if nodes < minNodes {
		return nodes
	}
	pct := 0
	if percentage != nil {
		pct = int(*percentage)
	}
	if pct == 0 {
		pct = max(50-nodes/125, minPercentage)
	}
	return max(nodes*pct/100, minNodes)
}
