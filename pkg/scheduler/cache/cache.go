// Package cache is tessera-scheduler's view of every GPU's usage: per node,
// the inventory its agent published and the assignments booked there, with
// a memo of each request shape's fit per node and the candidate nodes per
// shape. The TesseraGPU plugin reads it in Filter and Score, books into it
// in Reserve, and keeps it in step with the informers.
//
// Files by concept: nodes.go (inventories, carriers, cluster extents),
// bookings.go (a pod's life: reserved, bound, gone, awaiting reclaim),
// memo.go (request shapes and the per-node fit memo), lookup.go (Filter's
// and Score's questions), staleness.go (whether the cache may lag the
// scheduler's snapshot), candidates.go (the nodes a shape may be tried on),
// reports.go (metrics callbacks).
package cache

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/pkg/allocator"
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
// Locking. mu guards the maps and each node's bookkeeping outside its usage
// (its carrier, live slots and reclaimed list). Every change takes it for
// writing — Reserve, AddBound, Forget, ForgetAssumed, Gone, ExpireReclaims,
// SetNode, RemoveNode, SetBare, and SameInventory when the carrier changes
// — so changes are serialized across the whole cluster and report their
// metrics in the order they happened. A node's usage (its allocator.Node)
// has its own lock too, which changes take under mu. Filter and Score take
// mu's read lock only to find the node, then read the node's fit memo with
// no lock at all, or on a miss place under the node's lock alone: they run
// in parallel across nodes and wait for a change only during the lookup.
// Lock order: mu, then a node's lock.
type Cache struct {
	oversub float64

	mu    sync.RWMutex
	nodes map[string]*nodeState
	// byCarrier files each node's state under its carrier (see nodeState),
	// the object the scheduler's snapshot hands Filter and Score: found by
	// the object's address, a node costs neither hashing its name nor
	// reading the map's copy of it, on every Filter call of every node. An
	// entry leaves when its state leaves nodes, so it always names the
	// state nodes holds for that name.
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

	// roomChanges versions the room on the cluster's GPUs: it counts the
	// changes that may have made room (a booking released, an inventory
	// installed or replaced). A scheduling cycle notes it when it starts,
	// so it can tell whether room appeared while it ran.
	roomChanges atomic.Uint64

	// shapes numbers the request shapes (allocator.Request.Key) seen, so
	// the per-node memo is keyed by a small integer rather than by a
	// shape's string, hashed on every node for every pod.
	shapesMu sync.RWMutex
	shapes   map[string]Shape

	// bare are the nodes seen without a usable inventory (guarded by mu);
	// inventoryEpoch versions the set of inventories: it counts the changes
	// to them and to bare (made under mu), after which candidates are
	// rebuilt.
	bare           map[string]bool
	inventoryEpoch atomic.Uint64
	// cands memoizes Candidates per shape.
	candMu sync.Mutex
	cands  map[Shape]*CandidateSet
}

// New returns an empty cache whose GPUs may hold up to oversub times
// their memory in slices.
func New(oversub float64) *Cache {
	return &Cache{oversub: oversub, nodes: map[string]*nodeState{}, byCarrier: map[*v1.Node]*nodeState{}, pods: map[types.UID]*podRecord{}, gone: map[types.UID]time.Time{},
		refused: map[types.UID]*podRecord{}, bare: map[string]bool{}}
}

// ErrNoInventory says a node has no GPU inventory in the cache.
var ErrNoInventory = errors.New("no GPU inventory")

// Oversubscription is how many times its memory a GPU may hold in slices
// (the allocator's memoryOversubscription this cache was made with).
func (c *Cache) Oversubscription() float64 { return c.oversub }
