package cache

import (
	"github.com/tessera-gpu/tessera/pkg/gpu"
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// RoomChanges versions the room on the cluster's GPUs: it grows with every
// change that may have made room (a booking released, an inventory
// installed or replaced), so a cycle that noted it can tell whether room
// appeared while it ran.
func (c *Cache) RoomChanges() uint64 { return c.roomChanges.Load() }

// Behind reports whether the cache may not yet have applied a change the
// scheduler's own snapshot of the node already shows: it books more slots
// there for live pods than the snapshot's pods request (a pod the scheduler
// saw deleted before this cache did), or the snapshot's node carries another
// inventory annotation than the one installed (raw; "" for none). The
// scheduler's queue and this cache hear each event on their own goroutines,
// so a pod the event requeued can be judged on the cache as it was before.
//
// bookings says whether the refusal being judged depends on what is booked:
// one that follows from the inventory alone (allocator.Code.FromInventory)
// can be stale only if the inventory is.
//
// Filter asks it on every node it refuses, so it reads the snapshot's maps
// only when it must: the requested slots only where the cache books any
// and the refusal depends on bookings, the annotation only where the node
// object is not the one the handler last saw carrying the installed
// inventory (informer objects are never modified in place, and the
// snapshot shares them).
func (c *Cache) Behind(info fwk.NodeInfo, bookings bool) bool {
	n := info.Node()
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, _, ok := c.stateOfLocked(n)
	if !ok {
		return n.Annotations[gpu.AnnotationInventory] != ""
	}
	if bookings && s.liveSlots > 0 && s.liveSlots > info.GetRequested().GetScalarResources()[gpu.ResourceGPU] {
		return true
	}
	return s.carrier != n && s.raw != n.Annotations[gpu.AnnotationInventory]
}

// SameInventory reports whether the node object carries the inventory
// annotation the node's usage was built from, so a node update that left it
// alone costs no decoding. It then makes the object the node's carrier, and
// keeps its copy of the string, the newest: Behind compares the scheduler's
// snapshot of the node with them on every refusal, and Go compares strings
// sharing their bytes without reading them. Only an object not yet the
// carrier takes the write lock (a node's update, not Filter's pace).
func (c *Cache) SameInventory(node *v1.Node) bool {
	raw := node.Annotations[gpu.AnnotationInventory]
	c.mu.RLock()
	s, ok := c.nodes[node.Name]
	same := ok && s.raw == raw
	// The carrier's raw is its own annotation string (carryLocked), so
	// an object that carries is current.
	current := same && s.carrier == node
	c.mu.RUnlock()
	if !same || current {
		return same
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.nodes[node.Name]; ok && s.raw == raw {
		c.putNodeLocked(node.Name, s)
		c.carryLocked(s, node)
		return true
	}
	return false
}
