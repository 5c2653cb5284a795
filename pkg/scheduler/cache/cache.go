package cache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Unlimited stands for a node's CPU and memory inside the allocator: the
// scheduler's own NodeResourcesFit plugin accounts them against every pod of
// the node, so the GPU cache must not second-guess it with a partial count.
const Unlimited = math.MaxInt64 / 4

// Cache is the scheduler's view of every GPU's usage: per node, the inventory
// its agent published and the assignments of the pods bound or being bound
// there. Scheduling cycles read it (Filter, Score), Reserve books into it and
// Unreserve releases, and the informers add bound pods and drop deleted ones,
// so a restarted scheduler rebuilds exactly what the API server records.
//
// Locking: mu guards the maps; each node has its own lock, so Filter runs in
// parallel across nodes and a booking on one node never waits for another.
// Lock order is mu, then a node's lock.
type Cache struct {
	oversub float64

	mu    sync.RWMutex
	nodes map[string]*nodeState
	// byCarrier files each node's state under its carrier (see nodeState),
	// the object the scheduler's snapshot hands Filter and Score: found by
	// the object's address, a node costs neither hashing its name nor
	// reading the map's copy of it, which at 5,000 nodes were 2.8 of a
	// churn round's 161.5 CPU-s. An entry leaves when its state leaves
	// nodes, so it always names the state nodes holds for that name.
	byCarrier map[*v1.Node]*nodeState
	pods      map[types.UID]*podRecord
	// refused indexes the records AddBound refused (a subset of pods,
	// pruned lazily), so a release looks only at them.
	refused map[types.UID]*podRecord
	// gone holds pods deleted from the API server, with when they were seen
	// gone, so an older event about one delivered late (see Gone) cannot book
	// it again. UIDs are never reused; entries are swept after goneTTL.
	gone      map[types.UID]time.Time
	lastSweep time.Time
	// largestGPUMiB and mostGPUs are the largest GPU of any node and the
	// most GPUs any node has, so PreFilter can refuse a request no node of
	// the cluster could ever hold, and the pod-deletion hint can leave such
	// a pod waiting. Written under mu (largest), read without it: a hint
	// runs once per waiting pod per event.
	largestGPUMiB atomic.Int64
	mostGPUs      atomic.Int64

	// onNodeChange is called, under mu, with a node whose usage or
	// inventory changed (metrics).
	onNodeChange func(name string, n *allocator.Node)
	// onNodeGone is called, under mu, with GPUs whose series must go: all
	// of a node that left, or those that left a node's inventory.
	onNodeGone func(name string, gpus []allocator.GPU)
	// reportCtx ends the reports (see reportUntil).
	reportCtx context.Context

	// freed counts the changes that may have made room: a booking released,
	// an inventory installed or replaced. A scheduling cycle notes it when
	// it starts, so it can tell whether room appeared while it ran.
	freed atomic.Uint64

	// shapes numbers the request shapes (allocator.Request.Key) seen, so
	// the per-node memo is keyed by a small integer: hashing a shape's
	// string on every node for every pod showed in a 1,000-node profile.
	shapesMu sync.RWMutex
	shapes   map[string]Shape

	// bare are the nodes seen without a usable inventory (guarded by mu);
	// epoch counts the changes to the inventories and to bare (made under
	// mu), after which candidates are rebuilt.
	bare  map[string]bool
	epoch atomic.Uint64
	// cands memoizes Candidates per shape.
	candMu sync.Mutex
	cands  map[Shape]*CandidateSet
}

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

type nodeState struct {
	mu   sync.Mutex
	node *allocator.Node
	// raw is the inventory annotation the node was built from, so an update
	// that does not change it costs nothing.
	raw string
	// carrier is the latest node object seen carrying raw (see
	// SameInventory), nil until one is; the state is filed under it in
	// byCarrier. carrierSlots is its allocatable tessera.dev/gpu, read once
	// per object rather than from the snapshot's map on every Filter call.
	// Guarded by the cache's mu.
	carrier      *v1.Node
	carrierSlots int64
	// version mirrors node.Version (written under mu by changed, or when
	// the state is built), so a memo is read without the node's lock.
	version atomic.Uint64
	// memo remembers, per request shape, whether it fits and its score at
	// the node's Version: a pod changes one node, so the next pods of the
	// same shape re-place on that node only. The allocator is
	// deterministic, so a memoized answer is the answer. It is a small
	// array in the node's state, one way per shape modulo memoWays (a
	// clash only costs a placement): a map per node cost two more cache
	// misses on every Filter call, which showed at 5,000 nodes. An entry
	// is replaced whole, never changed, so Filter reads it without the
	// node's lock (which, with reading node.Version, was 1.8 CPU-s of a
	// 5,000-node churn round's 161.5).
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

// slots is the device-plugin slots an assignment's pod takes: one per GPU
// granted to each container.
func slots(a *gpu.PodAssignment) int64 {
	var n int64
	for _, c := range a.Containers {
		n += int64(len(c.GPUs))
	}
	return n
}

// memoWays is the number of request shapes a node's memo holds at once:
// clusters run a handful of distinct shapes, and shapes are numbered in the
// order first seen, so the first memoWays never evict each other.
const memoWays = 8

type memoEntry struct {
	// shape is the entry's shape plus one: 0 is an empty way.
	shape   Shape
	version uint64
	reason  allocator.Reason
	score   float64
	// alloc is the allocator that placed: the score is its own, and so is
	// the reason unless the request's fit ignores the workload
	// (allocator.Request.FitIgnoresWorkload). The workload tracker swaps
	// allocators every few dozen pods; the fit of every node stays known.
	alloc *allocator.Allocator
}

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

// New returns an empty cache whose GPUs may hold up to oversub times
// their memory in slices.
func New(oversub float64) *Cache {
	return &Cache{oversub: oversub, nodes: map[string]*nodeState{}, byCarrier: map[*v1.Node]*nodeState{}, pods: map[types.UID]*podRecord{}, gone: map[types.UID]time.Time{},
		refused: map[types.UID]*podRecord{}, bare: map[string]bool{}}
}

// goneTTL is how long a deleted pod's UID is remembered: far longer than any
// informer delivery lag.
const goneTTL = 10 * time.Minute

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
	s.version.Store(n.Version)
	c.putNodeLocked(inv.Node, s)
	c.carryLocked(s, carrier)
	delete(c.bare, inv.Node)
	c.epoch.Add(1)
	c.freed.Add(1)
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
	c.epoch.Add(1)
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

// Oversubscription is how many times its memory a GPU may hold in slices
// (the allocator's memoryOversubscription this cache was made with).
func (c *Cache) Oversubscription() float64 { return c.oversub }

// MostGPUs is the number of GPUs of the node that has the most, 0 while no
// inventory is known.
func (c *Cache) MostGPUs() int { return int(c.mostGPUs.Load()) }

// ErrNoInventory says a node has no GPU inventory in the cache.
var ErrNoInventory = errors.New("no GPU inventory")

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

// place runs the allocator on the node's current usage, memoized per node
// version and shape; anyAlloc accepts an answer another allocator (another
// workload) memoized. A memoized answer is read without the node's lock: an
// entry for the version read is the answer at that version, as if read a
// moment before a change that landed meanwhile.
func (s *nodeState) place(a *allocator.Allocator, shape Shape, r *allocator.Request, anyAlloc bool) (allocator.Reason, float64) {
	way := &s.memo[int(shape)%memoWays]
	if e := way.Load(); e != nil && e.shape == shape+1 && e.version == s.version.Load() && (e.alloc == a || anyAlloc) {
		return e.reason, e.score
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var p allocator.Placement
	reason := a.Place(s.node, r, &p)
	way.Store(&memoEntry{shape: shape + 1, version: s.node.Version, reason: reason, score: p.Score, alloc: a})
	return reason, p.Score
}

// changed follows a change to the node's usage, made under its lock: it
// mirrors the version (so memo reads without the lock see the change) and
// returns a copy of the usage for the metrics.
func (s *nodeState) changed() *allocator.Node {
	s.version.Store(s.node.Version)
	return s.node.Clone()
}

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
	s.mu.Lock()
	var p allocator.Placement
	reason := a.Place(s.node, r, &p)
	if !reason.OK() {
		s.mu.Unlock()
		return nil, reason, nil
	}
	s.node.Apply(r, &p)
	asg := s.node.Assignment(r, &p)
	snap := s.changed()
	s.mu.Unlock()
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
	s.mu.Lock()
	err := s.node.AddAssignment(a, 0, 0, c.oversub)
	snap := s.changed()
	s.mu.Unlock()
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
	c.freed.Add(1)
	s.mu.Lock()
	s.node.RemoveAssignment(rec.assignment, 0, 0)
	// A refused assignment that fits now counts, as the node's agent now
	// honours it (deviceplugin.Honoured counts what was granted before).
	for uid, other := range c.refused {
		if cur, ok := c.pods[uid]; !ok || cur != other || !other.refused {
			delete(c.refused, uid) // gone, replaced or booked since
			continue
		}
		if other.assignment.Node == rec.assignment.Node && s.node.AddAssignment(other.assignment, 0, 0, c.oversub) == nil {
			other.booked, other.refused = true, false
			s.liveSlots += slots(other.assignment)
			delete(c.refused, uid)
		}
	}
	snap := s.changed()
	s.mu.Unlock()
	c.notify(rec.assignment.Node, snap)
}

// notify reports a node change. It runs under c.mu (callers hold it), which
// keeps metric updates in the order of the changes; the callback must not
// call back into the cache.
func (c *Cache) notify(name string, snap *allocator.Node) {
	if c.reporting() && c.onNodeChange != nil {
		c.onNodeChange(name, snap)
	}
}

// ReportUntil sends the cache's node changes to change and gone, in their
// order, until ctx ends. A cache whose scheduler stopped must not write the
// process's series any more: in one process (the playground, tessera up, the
// soak) a restarted scheduler's new cache reports the same GPUs, and the
// stopped one's last cycle still in flight — a Reserve, the Unreserve of a
// bind its stop cancelled, a reclaim expiring — would overwrite them with a
// frozen view whose pods nobody deletes from it any more: the soak saw the
// series keep slices booked with every pod gone.
func (c *Cache) ReportUntil(ctx context.Context, change func(string, *allocator.Node), gone func(string, []allocator.GPU)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reportCtx, c.onNodeChange, c.onNodeGone = ctx, change, gone
}

// reporting says whether changes are reported; callers hold mu.
func (c *Cache) reporting() bool { return c.reportCtx != nil && c.reportCtx.Err() == nil }

// Reporting says whether the cache's scheduler still runs, so that its view
// may be exported.
func (c *Cache) Reporting() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.reporting()
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

// Freed is the count of changes that may have made room so far.
func (c *Cache) Freed() uint64 { return c.freed.Load() }

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
	current := same && s.carrier == node && unsafe.StringData(s.raw) == unsafe.StringData(raw)
	c.mu.RUnlock()
	if !same || current {
		return same
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.nodes[node.Name]; ok && s.raw == raw {
		s.raw = raw
		c.putNodeLocked(node.Name, s)
		c.carryLocked(s, node)
		return true
	}
	return false
}

// carryLocked makes node (nil: none) the state's carrier, filed under it in
// byCarrier in place of the one before. Called with mu held.
func (c *Cache) carryLocked(s *nodeState, node *v1.Node) {
	if s.carrier == node {
		return
	}
	if s.carrier != nil && c.byCarrier[s.carrier] == s {
		delete(c.byCarrier, s.carrier)
	}
	s.carrier, s.carrierSlots = node, 0
	if node != nil {
		c.byCarrier[node] = s
		if q, ok := node.Status.Allocatable[gpu.ResourceGPU]; ok {
			s.carrierSlots = q.Value()
		}
	}
}

// putNodeLocked files a node's state under name, the key's bytes name's
// own. The handler passes the node object's Name, the string the
// scheduler's snapshot hands Filter and Score: a lookup then compares the
// key by pointer, not by reading both copies of it, which at 5,000 nodes
// was a cache miss on every call. (Deleting first makes the map keep this
// copy of the key, not the old one.)
func (c *Cache) putNodeLocked(name string, s *nodeState) {
	if old, ok := c.nodes[name]; ok && old != s {
		c.carryLocked(old, nil) // the name's new state takes its place
	}
	delete(c.nodes, name)
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
