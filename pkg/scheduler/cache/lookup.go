package cache

import (
	"github.com/tessera-gpu/tessera/pkg/allocator"
	v1 "k8s.io/api/core/v1"
)

// FitNode says whether a request of the given shape (its Key) fits a
// node's current usage, without booking; Filter asks it once per node per
// pod. The node is the scheduler's object, found by its address where it is
// the node's carrier, by its name otherwise. It also returns the object's allocatable
// tessera.dev/gpu (kubelet's device-plugin slots) where the cache has read
// it, -1 where it has not (the object is not the carrier).
func (c *Cache) FitNode(a *allocator.Allocator, node *v1.Node, shape Shape, r *allocator.Request) (reason allocator.Reason, allocatableSlots int64, err error) {
	s, allocatableSlots, ok := c.find(node)
	if !ok {
		return allocator.Reason{}, -1, ErrNoInventory
	}
	reason, _ = s.place(a, shape, r, r.FitIgnoresWorkload())
	return reason, allocatableSlots, nil
}

// ScoreNode is FitNode with the node's score under a's policy and workload.
func (c *Cache) ScoreNode(a *allocator.Allocator, node *v1.Node, shape Shape, r *allocator.Request) (allocator.Reason, float64, error) {
	s, _, ok := c.find(node)
	if !ok {
		return allocator.Reason{}, 0, ErrNoInventory
	}
	reason, score := s.place(a, shape, r, false)
	return reason, score, nil
}

// find is stateOfLocked under the read lock, with the object's allocatable
// slots where it is the node's carrier (-1 where it is not).
func (c *Cache) find(node *v1.Node) (s *nodeState, allocatableSlots int64, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, carried, ok := c.stateOfLocked(node)
	if !carried {
		return s, -1, ok
	}
	return s, s.carrierSlots, true
}

// stateOfLocked finds a node's state: by the object's address where it is
// the node's carrier (carried; the scheduler's snapshot shares the
// informer's objects), by its name otherwise. Called with mu held.
func (c *Cache) stateOfLocked(node *v1.Node) (s *nodeState, carried, ok bool) {
	if s, ok := c.byCarrier[node]; ok {
		return s, true, true
	}
	s, ok = c.nodes[node.Name]
	return s, false, ok
}
