package cache

import "github.com/tessera-gpu/tessera/pkg/allocator"

// Shape is a request shape's number in one Cache (see Cache.Shape).
type Shape int32

// Shape returns the number of a request shape (its Key), numbering it if
// it is new. Once per scheduling cycle, in PreFilter.
func (c *Cache) Shape(key string) Shape {
	c.shapesMu.RLock()
	id, ok := c.shapes[key]
	c.shapesMu.RUnlock()
	if ok {
		return id
	}
	c.shapesMu.Lock()
	defer c.shapesMu.Unlock()
	if id, ok := c.shapes[key]; ok {
		return id
	}
	if c.shapes == nil {
		c.shapes = map[string]Shape{}
	}
	id = Shape(len(c.shapes))
	c.shapes[key] = id
	return id
}

// memoWays is the number of request shapes a node's memo holds at once:
// clusters run a handful of distinct shapes, and shapes are numbered in the
// order first seen, so the first memoWays never evict each other.
const memoWays = 8

type memoEntry struct {
	// shape is the entry's shape plus one: 0 is an empty way.
	shape        Shape
	usageVersion uint64
	reason       allocator.Reason
	score        float64
	// alloc is the allocator that placed: the score is its own, and so is
	// the reason unless the request's fit ignores the workload
	// (allocator.Request.FitIgnoresWorkload). The workload tracker swaps
	// allocators every few dozen pods; the fit of every node stays known.
	alloc *allocator.Allocator
}

// place runs the allocator on the node's current usage, memoized per usage
// version and shape; anyAlloc accepts an answer another allocator (another
// workload) memoized. A memoized answer is read without the node's lock: an
// entry for the version read is the answer at that version, as if read a
// moment before a change that landed meanwhile.
func (s *nodeState) place(a *allocator.Allocator, shape Shape, r *allocator.Request, anyAlloc bool) (allocator.Reason, float64) {
	way := &s.memo[int(shape)%memoWays]
	if e := way.Load(); e != nil && e.shape == shape+1 && e.usageVersion == s.usageVersion.Load() && (e.alloc == a || anyAlloc) {
		return e.reason, e.score
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var p allocator.Placement
	reason := a.Place(s.node, r, &p)
	way.Store(&memoEntry{shape: shape + 1, usageVersion: s.node.Version, reason: reason, score: p.Score, alloc: a})
	return reason, p.Score
}

// update is the one way to change a node's usage once the node is in the
// cache: it runs change on the usage under the node's lock, then publishes
// the usage's version for the memo's lock-free reads, whatever change did,
// so no memoized answer outlives the usage it was computed on. It returns
// a copy of the usage for the metrics, or nil when change reports it
// changed nothing.
func (s *nodeState) update(change func(n *allocator.Node) bool) *allocator.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := change(s.node)
	s.usageVersion.Store(s.node.Version)
	if !changed {
		return nil
	}
	return s.node.Clone()
}
