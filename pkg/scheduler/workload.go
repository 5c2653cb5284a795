package scheduler

import (
	"sync"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// workloadWindow is how many recent GPU requests form the target workload of
// the fgd and tessera policies. The FGD paper estimates the workload from the
// pods seen; a window lets it follow a changing mix.
const workloadWindow = 2048

// refreshEvery is how many new requests make the tracker rebuild the target
// workload: often enough to follow the mix, rarely enough that its cost
// (a sort over at most workloadWindow shapes) does not show per pod.
const refreshEvery = 64

// workloadTracker keeps the last workloadWindow request shapes seen and the
// allocator scoring against them. Current is lock-free for scheduling cycles;
// Observe takes a lock.
type workloadTracker struct {
	coverage float64
	base     *allocator.Allocator

	mu      sync.Mutex
	ring    []*allocator.Request
	next    int
	counts  map[string]*allocator.ShapeCount
	pending int
	current *allocator.Allocator
}

func newWorkloadTracker(base *allocator.Allocator, coverage float64) *workloadTracker {
	return &workloadTracker{coverage: coverage, base: base, counts: map[string]*allocator.ShapeCount{}, current: base}
}

// Current is the allocator to use for one scheduling cycle.
func (t *workloadTracker) Current() *allocator.Allocator {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.current
}

// Observe counts one request (each pod once, when first seen) and rebuilds
// the workload every refreshEvery requests, or at once while it is empty.
func (t *workloadTracker) Observe(r *allocator.Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ring) < workloadWindow {
		t.ring = append(t.ring, r)
	} else {
		old := t.ring[t.next]
		if sc := t.counts[old.Key()]; sc != nil {
			if sc.Count--; sc.Count <= 0 {
				delete(t.counts, old.Key())
			}
		}
		t.ring[t.next] = r
		t.next = (t.next + 1) % workloadWindow
	}
	k := r.Key()
	if sc := t.counts[k]; sc != nil {
		sc.Count++
	} else {
		t.counts[k] = &allocator.ShapeCount{Request: r, Count: 1}
	}
	t.pending++
	if t.pending >= refreshEvery || t.current == t.base {
		t.rebuildLocked()
	}
}

func (t *workloadTracker) rebuildLocked() {
	t.pending = 0
	counts := make([]allocator.ShapeCount, 0, len(t.counts))
	for _, sc := range t.counts {
		counts = append(counts, *sc)
	}
	w, err := allocator.NewWorkload(counts, t.coverage)
	if err != nil {
		return // keep the previous workload; NewWorkload refuses only empty input
	}
	t.current = t.base.WithWorkload(w)
}
