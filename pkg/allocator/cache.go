package allocator

// Cache remembers, per node and request shape, whether the shape fits and its
// score, and per node the fragmentation state, each tagged with the node's
// Version. A pod changes one node, so the next pod re-scores one node instead of
// all of them. Placements through the cache are exactly those of Choose: the
// cached numbers come from the same function on the same input (a test checks
// it on whole trace replays).
//
// A Cache belongs to one allocator and one slice of nodes, and is not safe for
// concurrent use.
type Cache struct {
	a       *Allocator
	nodes   []*Node
	entries [][]cacheEntry // [shape][node]
	frag    []fragState
	fragVer []uint64 // Version+1 of the node frag was computed at; 0 = never
	scratch Placement
}

type cacheEntry struct {
	version uint64 // Version+1 of the node; 0 = empty
	ok      bool
	score   float64
}

// NewCache returns an empty cache over nodes.
func NewCache(a *Allocator, nodes []*Node) *Cache {
	c := &Cache{a: a, nodes: nodes}
	if a.usesFrag() {
		c.frag = make([]fragState, len(nodes))
		c.fragVer = make([]uint64, len(nodes))
	}
	return c
}

func (c *Cache) fragOf(i int) *fragState {
	if c.frag == nil {
		return nil
	}
	n := c.nodes[i]
	if c.fragVer[i] != n.Version+1 {
		c.a.workload.prepare(n, c.a.oversub, &c.frag[i])
		c.fragVer[i] = n.Version + 1
	}
	return &c.frag[i]
}

// Choose is Allocator.Choose for a request of the given shape: shape is the
// caller's dense id (0, 1, 2, …) of the request's Key, the same for requests
// with equal keys.
func (c *Cache) Choose(r *Request, shape int, p *Placement) int {
	for shape >= len(c.entries) {
		c.entries = append(c.entries, nil)
	}
	if c.entries[shape] == nil {
		c.entries[shape] = make([]cacheEntry, len(c.nodes))
	}
	row := c.entries[shape]
	best := -1
	var bestScore float64
	for i, n := range c.nodes {
		e := &row[i]
		if e.version != n.Version+1 {
			ok := c.a.place(n, r, &c.scratch, c.fragOf(i)).OK()
			*e = cacheEntry{version: n.Version + 1, ok: ok, score: c.scratch.Score}
		}
		if e.ok && (best < 0 || e.score > bestScore) {
			best, bestScore = i, e.score
		}
	}
	if best >= 0 {
		c.a.place(c.nodes[best], r, p, c.fragOf(best))
	}
	return best
}
