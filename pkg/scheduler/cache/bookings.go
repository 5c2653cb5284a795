package cache

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"k8s.io/apimachinery/pkg/types"
)

// podRecord is one pod's booking. A booking whose node has no inventory (the
// agent is gone, or the node was deleted) is kept, so the pod's GPUs are
// booked again as soon as the inventory returns, and is reported as orphaned.
type podRecord struct {
	name       string // namespace/name, for reports
	assignment *gpu.PodAssignment
	// assumed is true between Reserve and the informer seeing the pod bound.
	assumed bool
	// booked says the assignment is counted in its node's usage.
	booked bool
	// awaitingReclaim: a preemption victim gone from the API server whose
	// node's agent has not yet confirmed its GPUs clean; its slices stay
	// booked until then (or the reclaim timeout), since it was seen gone.
	awaitingReclaim bool
	goneAt          time.Time
	// preemptor is, for a victim awaiting reclaim, the pod its notice
	// named ("" when unreadable): the slices are that pod's once freed.
	preemptor types.UID
	// refused: AddBound found the assignment over its node's limits when
	// the pod was first seen bound, so it was never counted (the agent
	// refuses it too).
	refused bool
}

// slots is the device-plugin slots an assignment's pod takes: one per GPU
// granted to each container.
func slots(a *gpu.PodAssignment) int64 {
	var n int64
	for _, c := range a.Containers {
		n += int64(len(c.GPUs))
	}
	return n
}

// goneTTL is how long a deleted pod's UID is remembered: far longer than any
// informer delivery lag.
const goneTTL = 10 * time.Minute

// Reserve places and books a pod on a node in one step under the node's lock,
// so two cycles (or a cycle and a binding goroutine) can never book the same
// slice. It returns the assignment, or the reason the pod no longer fits.
func (c *Cache) Reserve(a *allocator.Allocator, uid types.UID, podName, node string, r *allocator.Request) (*gpu.PodAssignment, allocator.Reason, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.nodes[node]
	if !ok {
		return nil, allocator.Reason{}, ErrNoInventory
	}
	if old, ok := c.pods[uid]; ok {
		// A retried Reserve for a pod already booked (its old booking was
		// never released): drop the old one first.
		c.unbookLocked(old)
		delete(c.pods, uid)
	}
	var reason allocator.Reason
	var asg *gpu.PodAssignment
	snap := s.update(func(n *allocator.Node) bool {
		var p allocator.Placement
		if reason = a.Place(n, r, &p); !reason.OK() {
			return false
		}
		n.Apply(r, &p)
		asg = n.Assignment(r, &p)
		return true
	})
	if !reason.OK() {
		return nil, reason, nil
	}
	c.pods[uid] = &podRecord{name: podName, assignment: asg, assumed: true, booked: true}
	s.liveSlots += slots(asg)
	c.notify(node, snap)
	return asg, reason, nil
}

// Forget releases a pod's booking (Unreserve, pod deletion, pod finished).
// It is idempotent.
func (c *Cache) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.pods[uid]
	if !ok {
		return
	}
	delete(c.pods, uid)
	c.unbookLocked(rec)
}

// Gone releases a pod deleted from the API server (or finished) and keeps it
// from being booked again by an older event delivered late (an informer's
// relist can hand over a pod's last known state after its deletion was seen).
// It is idempotent.
//
// A preemption victim (victim true) is not released yet: its slices stay
// booked until its node's inventory lists it as reclaimed — the agent found
// no process of it left on its GPUs — or ExpireReclaims gives up on it.
func (c *Cache) Gone(uid types.UID, victim bool) { c.release(uid, victim, "") }

// GoneVictimOf is Gone for a preemption victim whose notice names
// preemptor, which Reclaiming reports with it.
func (c *Cache) GoneVictimOf(uid, preemptor types.UID) { c.release(uid, true, preemptor) }

func (c *Cache) release(uid types.UID, victim bool, preemptor types.UID) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if rec, ok := c.pods[uid]; ok {
		s := c.nodes[rec.assignment.Node]
		switch {
		case rec.awaitingReclaim:
		case victim && rec.booked && s != nil && !s.reclaimed[string(uid)]:
			rec.awaitingReclaim, rec.goneAt, rec.preemptor = true, now, preemptor
			s.liveSlots -= slots(rec.assignment)
		default:
			delete(c.pods, uid)
			c.unbookLocked(rec)
		}
	}
	c.gone[uid] = now
	if now.Sub(c.lastSweep) > time.Minute {
		c.lastSweep = now
		for u, t := range c.gone {
			if now.Sub(t) > goneTTL {
				delete(c.gone, u)
			}
		}
	}
}

// ExpireReclaims releases victims whose reclaim was not confirmed within
// timeout of their leaving, and returns their names: a node whose agent is
// gone must not hold slices forever.
func (c *Cache) ExpireReclaims(now time.Time, timeout time.Duration) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for uid, rec := range c.pods {
		if rec.awaitingReclaim && now.Sub(rec.goneAt) >= timeout {
			delete(c.pods, uid)
			c.unbookLocked(rec)
			out = append(out, rec.name)
		}
	}
	sort.Strings(out)
	return out
}

// AwaitingReclaim counts the victims whose slices wait for their agent.
func (c *Cache) AwaitingReclaim() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for _, rec := range c.pods {
		if rec.awaitingReclaim {
			n++
		}
	}
	return n
}

// ForgetAssumed is Unreserve: it releases the booking only while it is still
// assumed, so a late Unreserve never undoes a pod the informer saw bound.
func (c *Cache) ForgetAssumed(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.pods[uid]
	if !ok || !rec.assumed {
		return
	}
	delete(c.pods, uid)
	c.unbookLocked(rec)
}

// ErrAssignmentChanged says a bound pod's assignment differs from the one
// the cache first saw it bound with; the first one stays booked.
var ErrAssignmentChanged = errors.New("the GPU assignment changed after the pod was bound; the first one stays booked")

// AddBound records a bound pod's assignment as read from the API server: it
// confirms an assumed booking (replacing it when the bound pod says
// otherwise), or books a pod the cache has not seen (scheduler restart). The
// first assignment a bound pod is seen with is the one that counts: a later
// different one is ignored and reported as ErrAssignmentChanged, as the
// node's agent ignores it. An assignment that does not fit its node's
// inventory is recorded unbooked and reported as an error. A pod already
// Gone is ignored.
func (c *Cache) AddBound(uid types.UID, podName string, a *gpu.PodAssignment) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, gone := c.gone[uid]; gone {
		return nil
	}
	if old, ok := c.pods[uid]; ok {
		if sameAssignment(old.assignment, a) {
			old.assumed = false
			return nil
		}
		if !old.assumed {
			return fmt.Errorf("pod %s: %w", podName, ErrAssignmentChanged)
		}
		c.unbookLocked(old)
		delete(c.pods, uid)
	}
	rec := &podRecord{name: podName, assignment: a}
	c.pods[uid] = rec
	s, ok := c.nodes[a.Node]
	if !ok {
		return nil // orphaned until the node's inventory appears
	}
	var err error
	snap := s.update(func(n *allocator.Node) bool {
		err = n.AddAssignment(a, 0, 0, c.oversub)
		return err == nil
	})
	if err != nil {
		rec.refused = true
		c.refused[uid] = rec
		return fmt.Errorf("pod %s: %w", podName, err)
	}
	rec.booked = true
	s.liveSlots += slots(a)
	c.notify(a.Node, snap)
	return nil
}

func (c *Cache) unbookLocked(rec *podRecord) {
	if !rec.booked {
		return
	}
	rec.booked = false
	s, ok := c.nodes[rec.assignment.Node]
	if !ok {
		return
	}
	if !rec.awaitingReclaim {
		s.liveSlots -= slots(rec.assignment)
	}
	c.roomChanges.Add(1)
	snap := s.update(func(n *allocator.Node) bool {
		n.RemoveAssignment(rec.assignment, 0, 0)
		// A refused assignment that fits now counts, as the node's agent
		// now honours it (deviceplugin.Honoured counts what was granted
		// before).
		for uid, other := range c.refused {
			if cur, ok := c.pods[uid]; !ok || cur != other || !other.refused {
				delete(c.refused, uid) // gone, replaced or booked since
				continue
			}
			if other.assignment.Node == rec.assignment.Node && n.AddAssignment(other.assignment, 0, 0, c.oversub) == nil {
				other.booked, other.refused = true, false
				s.liveSlots += slots(other.assignment)
				delete(c.refused, uid)
			}
		}
		return true
	})
	c.notify(rec.assignment.Node, snap)
}

// Orphans lists the pods whose booking is not counted on any node because
// their node has no inventory. Assignments refused as over their node's
// limits are not orphans: they are reported when refused.
func (c *Cache) Orphans() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for _, rec := range c.pods {
		if !rec.booked && !rec.refused {
			out = append(out, rec.name)
		}
	}
	sort.Strings(out)
	return out
}

// ReclaimingVictim is a preemption victim gone from the API server whose
// slices stay booked until its node's agent confirms them clean.
type ReclaimingVictim struct {
	Assignment *gpu.PodAssignment
	// Preemptor is the pod the victim's notice named ("" if unreadable).
	Preemptor types.UID
}

// Reclaiming lists, by node, the victims awaiting reclaim: the slices their
// preemptors are about to get, which a preemption must count as freed for
// them rather than choose more victims. One pass over the pods serves every
// node a preemption looks at.
func (c *Cache) Reclaiming() map[string][]ReclaimingVictim {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string][]ReclaimingVictim{}
	for _, rec := range c.pods {
		if rec.awaitingReclaim && rec.booked {
			node := rec.assignment.Node
			out[node] = append(out[node], ReclaimingVictim{Assignment: rec.assignment, Preemptor: rec.preemptor})
		}
	}
	for _, vs := range out {
		sort.Slice(vs, func(i, j int) bool { return vs[i].Preemptor < vs[j].Preemptor })
	}
	return out
}

// Assignment returns the assignment booked for a pod.
func (c *Cache) Assignment(uid types.UID) *gpu.PodAssignment {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if rec, ok := c.pods[uid]; ok {
		return rec.assignment
	}
	return nil
}

func sameAssignment(a, b *gpu.PodAssignment) bool {
	if a.Node != b.Node || len(a.Containers) != len(b.Containers) {
		return false
	}
	for i := range a.Containers {
		x, y := a.Containers[i], b.Containers[i]
		if x.Name != y.Name || x.Mode != y.Mode || len(x.GPUs) != len(y.GPUs) {
			return false
		}
		for j := range x.GPUs {
			if x.GPUs[j] != y.GPUs[j] {
				return false
			}
		}
	}
	return true
}
