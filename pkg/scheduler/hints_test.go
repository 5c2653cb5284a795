package scheduler

import (
	"context"
	"slices"
	"sort"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// fakeQueue records the pods the plugin activates.
type fakeQueue struct {
	mu        sync.Mutex
	activated []string
}

func (q *fakeQueue) Activate(_ klog.Logger, pods map[string]*v1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k := range pods {
		q.activated = append(q.activated, k)
	}
	sort.Strings(q.activated)
}

func (q *fakeQueue) take() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.activated
	q.activated = nil
	return out
}

// hintPlugin is a plugin on an empty cache, activating into q.
func hintPlugin(t testing.TB, q *fakeQueue) *Plugin {
	t.Helper()
	registerMetrics()
	cfg := config.Default().Allocator
	cfg.MemoryOversubscription = 1
	base, err := allocator.New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &Plugin{cfg: &cfg, queue: q, shared: &shared{cache: cache.New(1), workload: newWorkloadTracker(base, cfg.WorkloadCoverage)}}
	p.synced.Store(true)
	return p
}

// tryOnce runs one scheduling cycle's PreFilter, Filter on each node, and
// PostFilter when no node fits; it says whether some node fitted.
func tryOnce(t *testing.T, p *Plugin, pod *v1.Pod, between func(), nodes ...fwk.NodeInfo) bool {
	t.Helper()
	ctx := context.Background()
	state := framework.NewCycleState()
	if _, st := p.PreFilter(ctx, state, pod, nil); !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	statuses := framework.NewDefaultNodeToStatus()
	fits := false
	for _, n := range nodes {
		st := p.Filter(ctx, state, pod, n)
		fits = fits || st.IsSuccess()
		statuses.Set(n.Node().Name, st)
	}
	if between != nil {
		between()
	}
	if !fits {
		p.PostFilter(ctx, state, pod, statuses)
	}
	return fits
}

// TestHintsOnlyLook: a hint answers from the event alone and leaves the
// cache as it was; the framework calls it once per waiting pod.
func TestHintsOnlyLook(t *testing.T) {
	p := hintPlugin(t, &fakeQueue{})
	logger := klog.Background()
	inv := schedtest.Inventory("n1", 1, 81920, false)
	node := schedtest.InventoryNode(t, inv)
	if _, err := p.cache.SetNode(node.Annotations[gpu.AnnotationInventory], inv); err != nil {
		t.Fatal(err)
	}
	held := schedtest.GPUPod(t, "held", "n1", 0)
	p.onPod(logger, held, false)
	slotsOnly := schedtest.GPUPod(t, "refused", "n1", 0)
	delete(slotsOnly.Annotations, gpu.AnnotationAssignment)
	plain := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "web", UID: "web"}, Spec: v1.PodSpec{NodeName: "n1"}}

	otherInv := schedtest.Inventory("n1", 2, 81920, false)
	changed := schedtest.InventoryNode(t, otherInv)
	moreSlots := node.DeepCopy()
	moreSlots.Status.Allocatable[gpu.ResourceGPU] = resource.MustParse("64")
	bare := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-only"}}
	newBare := bare.DeepCopy()
	newBare.Labels = map[string]string{"x": "y"}
	waiting := schedtest.GPUPod(t, "waiting", "", 0)
	tooBig := schedtest.GPUPod(t, "too-big", "", 0)
	tooBig.Spec.Containers[0].Resources.Limits[gpu.ResourceGPU] = resource.MustParse("2")
	for _, c := range []struct {
		name     string
		hint     fwk.QueueingHintFn
		old, new any
		want     fwk.QueueingHint
		waiting  *v1.Pod // nil: a pod asking for one GPU
	}{
		{"GPU pod deleted", p.hintGPUPodGone, held, nil, fwk.Queue, nil},
		{"pod with slots and no assignment deleted", p.hintGPUPodGone, slotsOnly, nil, fwk.Queue, nil},
		{"pod without GPUs deleted", p.hintGPUPodGone, plain, nil, fwk.QueueSkip, nil},
		{"not a pod", p.hintGPUPodGone, "what", nil, fwk.Queue, nil},
		{"GPU pod deleted, waiting pod larger than any node", p.hintGPUPodGone, held, nil, fwk.QueueSkip, tooBig},
		{"not a pod, waiting pod larger than any node", p.hintGPUPodGone, "what", nil, fwk.QueueSkip, tooBig},
		{"node added, waiting pod larger than any node", p.hintInventoryChanged, nil, node, fwk.Queue, tooBig},
		{"node added with an inventory", p.hintInventoryChanged, nil, node, fwk.Queue, nil},
		{"inventory changed", p.hintInventoryChanged, node, changed, fwk.Queue, nil},
		{"slots changed", p.hintInventoryChanged, node, moreSlots, fwk.Queue, nil},
		{"nothing of ours changed", p.hintInventoryChanged, node, node.DeepCopy(), fwk.QueueSkip, nil},
		{"node without inventory", p.hintInventoryChanged, bare, newBare, fwk.QueueSkip, nil},
		{"not a node", p.hintInventoryChanged, nil, "what", fwk.Queue, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := p.cache.RoomChanges()
			pod := waiting
			if c.waiting != nil {
				pod = c.waiting
			}
			got, err := c.hint(logger, pod, c.old, c.new)
			if err != nil || got != c.want {
				t.Fatalf("hint = %v, %v; want %v", got, err, c.want)
			}
			if p.cache.RoomChanges() != before || p.cache.Assignment("held") == nil || len(p.cache.Snapshot("n1").GPUs) != 1 {
				t.Fatal("the hint changed the cache")
			}
		})
	}
}

// TestRequeuedBeforeTheCacheCaughtUp: the scheduler's queue hears a GPU pod's
// deletion (or a node's new inventory) before the plugin's handler applies
// it, and tries a waiting pod on the cache as it was. The pod is activated
// once the handler has applied the change — at once when that happened
// while the pod was being tried — and a pod judged on a cache that was not
// behind is left to the queue's hints.
func TestRequeuedBeforeTheCacheCaughtUp(t *testing.T) {
	logger := klog.Background()
	setup := func(t *testing.T) (*Plugin, *fakeQueue, *v1.Node, *v1.Pod) {
		q := &fakeQueue{}
		p := hintPlugin(t, q)
		inv := schedtest.Inventory("n1", 1, 81920, false)
		node := schedtest.InventoryNode(t, inv)
		p.onNode(logger, node)
		held := schedtest.GPUPod(t, "held", "n1", 0)
		p.onPod(logger, held, false)
		return p, q, node, held
	}

	t.Run("deletion applied after the pod was tried", func(t *testing.T) {
		p, q, node, held := setup(t)
		// The scheduler already dropped held: its snapshot has no pod there.
		if tryOnce(t, p, schedtest.GPUPod(t, "waiting", "", 0), nil, schedtest.SnapshotOf(node)) {
			t.Fatal("fits before the cache freed the GPU")
		}
		if got := q.take(); len(got) != 0 {
			t.Fatalf("activated %v before the cache caught up", got)
		}
		p.onPodDelete(held)
		if got := q.take(); !slices.Equal(got, []string{"ml/waiting"}) {
			t.Fatalf("activated %v after the deletion was applied, want ml/waiting", got)
		}
		p.onPod(logger, schedtest.GPUPod(t, "other", "", 0), false) // no room made since
		if got := q.take(); len(got) != 0 {
			t.Fatalf("activated %v again without a change", got)
		}
	})

	t.Run("deletion applied while the pod was tried", func(t *testing.T) {
		p, q, node, held := setup(t)
		if tryOnce(t, p, schedtest.GPUPod(t, "waiting", "", 0), func() { p.onPodDelete(held) }, schedtest.SnapshotOf(node)) {
			t.Fatal("fits before the cache freed the GPU")
		}
		if got := q.take(); !slices.Equal(got, []string{"ml/waiting"}) {
			t.Fatalf("activated %v, want ml/waiting at once", got)
		}
	})

	t.Run("inventory applied after the pod was tried", func(t *testing.T) {
		p, q, _, _ := setup(t)
		late := schedtest.InventoryNode(t, schedtest.Inventory("n2", 2, 81920, false))
		if tryOnce(t, p, schedtest.GPUPod(t, "waiting", "", 0), nil, schedtest.SnapshotOf(late)) {
			t.Fatal("fits a node the cache does not know")
		}
		p.onNode(logger, late)
		if got := q.take(); !slices.Equal(got, []string{"ml/waiting"}) {
			t.Fatalf("activated %v after the inventory was applied, want ml/waiting", got)
		}
	})

	t.Run("cache not behind", func(t *testing.T) {
		p, q, node, held := setup(t)
		if tryOnce(t, p, schedtest.GPUPod(t, "waiting", "", 0), nil, schedtest.SnapshotOf(node, held)) {
			t.Fatal("fits a full node")
		}
		p.onPodDelete(held)
		if got := q.take(); len(got) != 0 {
			t.Fatalf("activated %v: the hint requeues it, activation would skip its backoff", got)
		}
	})

	t.Run("a waiter that was placed or left is not activated", func(t *testing.T) {
		p, q, node, held := setup(t)
		gone := schedtest.GPUPod(t, "gone", "", 0)
		if tryOnce(t, p, gone, nil, schedtest.SnapshotOf(node)) {
			t.Fatal("fits")
		}
		p.onPodDelete(gone)
		p.onPodDelete(held)
		if got := q.take(); len(got) != 0 {
			t.Fatalf("activated %v, a pod that was deleted", got)
		}
	})
}
