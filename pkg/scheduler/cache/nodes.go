package cache

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	v1 "k8s.io/api/core/v1"
)

type nodeState struct {
	mu   sync.Mutex
	node *allocator.Node
	// raw is the inventory annotation the node was built from, so an update
	// that does not change it costs nothing.
	raw string
	// carrier is the latest node object seen carrying raw (see
	// SameInventory), nil until one is; the state is filed under it in
	// byCarrier, and raw is then the carrier's own annotation string (the
	// same bytes: Go compares such strings without reading them).
	// carrierSlots is its allocatable tessera.dev/gpu, read once per object
	// rather than from the snapshot's map on every Filter call. Guarded by
	// the cache's mu.
	carrier      *v1.Node
	carrierSlots int64
	// usageVersion versions the node's usage for the memo: it mirrors
	// node.Version, published by update (or when the state is built), so
	// a memo entry is checked without the node's lock.
	usageVersion atomic.Uint64
	// memo remembers, per request shape, whether it fits and its score at
	// the node's Version: a pod changes one node, so the next pods of the
	// same shape re-place on that node only. The allocator is
	// deterministic, so a memoized answer is the answer. It is a small
	// array in the node's state, one way per shape modulo memoWays (a
	// clash only costs a placement): a map per node would cost two more
	// cache misses on every Filter call. An entry is replaced whole, never
	// changed, so Filter reads it without the node's lock, which every
	// Filter call would otherwise take.
	memo [memoWays]atomic.Pointer[memoEntry]
	// reclaimed is the inventory's list of victims the agent verified gone.
	reclaimed map[string]bool
	// empty is the node as its inventory describes it, nothing booked;
	// emptyFit memoizes the allocator's answer there per shape (guarded by
	// mu). See candidates.
	empty    *allocator.Node
	emptyFit map[Shape]allocator.Reason
	// liveSlots is the device-plugin slots of the pods booked here that are
	// still in the API server (victims awaiting reclaim are not): what the
	// scheduler's own snapshot counts as the node's requested tessera.dev/gpu
	// for the same pods (see Behind). Guarded by the cache's mu.
	liveSlots int64
}

// SetNode installs or replaces a node's inventory. A new inventory (more
// GPUs, a GPU turned unhealthy) rebuilds the node's usage from the pods booked
// on it. A booking that no longer fits (a GPU smaller or gone, fewer slices)
// is never dropped: its pod is running there, so it is counted anyway
// (allocator.Node.ForceAssignment) and the GPU stays over-full, taking
// nothing new, until the pod leaves. Those pods are returned so the caller
// can report them. Assignments AddBound refused (they never fit: a forged
// or corrupted record) are tried again, and stay uncounted unless they fit.
func (c *Cache) SetNode(raw string, inv *gpu.NodeInventory) ([]string, error) {
	return c.setNode(raw, inv, nil)
}

// SetNodeFrom is SetNode for the inventory read from a node object (the
// handler's case): the node is filed under the object's own copy of its
// name (see putNodeLocked) and the object remembered as carrying the
// inventory (see Behind). inv must describe that node.
func (c *Cache) SetNodeFrom(node *v1.Node, inv *gpu.NodeInventory) ([]string, error) {
	inv.Node = node.Name
	return c.setNode(node.Annotations[gpu.AnnotationInventory], inv, node)
}

func (c *Cache) setNode(raw string, inv *gpu.NodeInventory, carrier *v1.Node) ([]string, error) {
	n, err := allocator.NewNode(inv)
	if err != nil {
		return nil, err
	}
	n.CPUMilli, n.MemoryMiB = Unlimited, Unlimited
	empty := n.Clone()
	var overfull []string
	c.mu.Lock()
	if old, ok := c.nodes[inv.Node]; ok && old.raw == raw {
		if carrier != nil {
			c.carryLocked(old, carrier)
		}
		c.mu.Unlock()
		return nil, nil
	}
	reclaimed := make(map[string]bool, len(inv.Reclaimed))
	for _, uid := range inv.Reclaimed {
		reclaimed[uid] = true
	}
	// Running pods first, so a refused record never takes a place one of
	// them holds.
	var refused []*podRecord
	var live int64 // the node's liveSlots
	for uid, rec := range c.pods {
		if rec.assignment.Node != inv.Node {
			continue
		}
		if rec.awaitingReclaim && reclaimed[string(uid)] {
			delete(c.pods, uid)
			continue
		}
		if rec.refused {
			refused = append(refused, rec)
			continue
		}
		rec.booked = true
		if !rec.awaitingReclaim {
			live += slots(rec.assignment)
		}
		if n.AddAssignment(rec.assignment, 0, 0, c.oversub) != nil {
			n.ForceAssignment(rec.assignment, 0, 0)
			overfull = append(overfull, rec.name)
		}
	}
	for _, rec := range refused {
		if n.AddAssignment(rec.assignment, 0, 0, c.oversub) == nil {
			rec.booked, rec.refused = true, false
			live += slots(rec.assignment)
		}
	}
	// GPUs the node no longer reports (or reports as another index or
	// model) lose their series.
	var left []allocator.GPU
	var before *allocator.Node
	if old, ok := c.nodes[inv.Node]; ok {
		before = old.node
		now := map[string]bool{}
		for _, g := range n.GPUs {
			now[gpuSeries(&g)] = true
		}
		for _, g := range old.node.GPUs {
			if !now[gpuSeries(&g)] {
				left = append(left, g)
			}
		}
	}
	s := &nodeState{node: n, raw: raw, reclaimed: reclaimed, liveSlots: live, empty: empty}
	s.usageVersion.Store(n.Version)
	c.putNodeLocked(inv.Node, s)
	c.carryLocked(s, carrier)
	delete(c.bare, inv.Node)
	c.inventoryEpoch.Add(1)
	c.roomChanges.Add(1)
	c.extentChangedLocked(before, n)
	// The metrics follow under the lock, as every change's do: reported
	// after unlocking, this snapshot could land after a newer one (a pod
	// deleted meanwhile) and leave the series showing slices no pod holds
	// (the soak's "the scheduler books 9 slices" with every pod gone).
	if len(left) > 0 && c.reporting() && c.onNodeGone != nil {
		c.onNodeGone(inv.Node, left)
	}
	c.notify(inv.Node, n.Clone())
	c.mu.Unlock()
	sort.Strings(overfull)
	return overfull, nil
}

// gpuSeries identifies a GPU's metric series (its labels but the node's).
func gpuSeries(g *allocator.GPU) string {
	return fmt.Sprintf("%s/%d/%s", g.UUID, g.Index, g.Model)
}

// RemoveNode forgets a node's inventory; its pods' bookings are kept for its
// return.
func (c *Cache) RemoveNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.nodes[name]
	if !ok {
		return
	}
	delete(c.nodes, name)
	c.carryLocked(s, nil)
	c.inventoryEpoch.Add(1)
	c.extentChangedLocked(s.node, nil)
	for _, rec := range c.pods {
		if rec.assignment.Node == name {
			rec.booked = false
		}
	}
	// Under the lock, in order with the node's other changes (a re-added
	// node's series must not be dropped by its removal reported late).
	if c.reporting() && c.onNodeGone != nil {
		c.onNodeGone(name, s.node.GPUs)
	}
}

// NodeNames lists the nodes with a usable inventory, sorted.
func (c *Cache) NodeNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]string, 0, len(c.nodes))
	for n := range c.nodes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// HasNode reports whether the node has a usable inventory.
func (c *Cache) HasNode(name string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.nodes[name]
	return ok
}

// extent is a node's largest GPU and its number of GPUs (0, 0 for nil).
func extent(n *allocator.Node) (memMiB, count int64) {
	if n == nil {
		return 0, 0
	}
	for i := range n.GPUs {
		memMiB = max(memMiB, n.GPUs[i].MemoryMiB)
	}
	return memMiB, int64(len(n.GPUs))
}

// extentChangedLocked keeps the largest GPU and the most GPUs of any node
// current as a node's inventory goes from before to after (nil: none). It
// passes over every node only when the node that held a maximum shrank or
// left: a pass per inventory would make 5,000 nodes joining quadratic.
// Called with mu held.
func (c *Cache) extentChangedLocked(before, after *allocator.Node) {
	beforeMem, beforeCount := extent(before)
	mem, count := extent(after)
	if beforeMem == c.largestGPUMiB.Load() && mem < beforeMem || beforeCount == c.mostGPUs.Load() && count < beforeCount {
		for _, s := range c.nodes {
			m, n := extent(s.node)
			mem, count = max(mem, m), max(count, n)
		}
		c.largestGPUMiB.Store(mem)
		c.mostGPUs.Store(count)
		return
	}
	c.largestGPUMiB.Store(max(c.largestGPUMiB.Load(), mem))
	c.mostGPUs.Store(max(c.mostGPUs.Load(), count))
}

// MaxGPUMemoryMiB is the memory of the largest GPU the cluster has, 0 while
// no inventory is known.
func (c *Cache) MaxGPUMemoryMiB() int64 { return c.largestGPUMiB.Load() }

// MostGPUs is the number of GPUs of the node that has the most, 0 while no
// inventory is known.
func (c *Cache) MostGPUs() int { return int(c.mostGPUs.Load()) }

// carryLocked makes node (nil: none) the state's carrier, filed under it in
// byCarrier in place of the one before, and the state's raw its annotation
// string. node must carry the inventory the state was built from. Called
// with mu held.
func (c *Cache) carryLocked(s *nodeState, node *v1.Node) {
	if s.carrier == node {
		return
	}
	if s.carrier != nil && c.byCarrier[s.carrier] == s {
		delete(c.byCarrier, s.carrier)
	}
	s.carrier, s.carrierSlots = node, 0
	if node != nil {
		s.raw = node.Annotations[gpu.AnnotationInventory]
		c.byCarrier[node] = s
		if q, ok := node.Status.Allocatable[gpu.ResourceGPU]; ok {
			s.carrierSlots = q.Value()
		}
	}
}

// putNodeLocked files a node's state under name. The handler passes the
// node object's Name, the string the scheduler's snapshot hands Filter and
// Score, and a map assignment stores the key it is given even where the key
// was there (Go's runtime updates a string key's bytes on assignment, for
// this reason among others): a lookup then compares the key by pointer, not
// by reading both copies of it, a cache miss saved on every call.
func (c *Cache) putNodeLocked(name string, s *nodeState) {
	if old, ok := c.nodes[name]; ok && old != s {
		c.carryLocked(old, nil) // the name's new state takes its place
	}
	c.nodes[name] = s
}

// Snapshot returns a copy of a node's usage, or nil.
func (c *Cache) Snapshot(name string) *allocator.Node {
	c.mu.RLock()
	s, ok := c.nodes[name]
	c.mu.RUnlock()
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.node.Clone()
}
