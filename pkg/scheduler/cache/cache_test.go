package cache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// TestConcurrentReserveNeverOverbooks: many cycles and binding goroutines
// booking one node at once must never exceed a GPU's limits, and every
// booking that succeeded must be counted exactly once.
func TestConcurrentReserveNeverOverbooks(t *testing.T) {
	c := New(1.5)
	if _, err := c.SetNode("a", schedtest.Inventory("n1", 8, 81920, true)); err != nil {
		t.Fatal(err)
	}
	a := schedtest.NewAllocator(t)
	req := schedtest.SliceOf(gpu.ModeMPS, 8192, 10)
	const pods = 200 // capacity is 8 GPUs × 10 slices of 10 %
	var wg sync.WaitGroup
	var mu sync.Mutex
	booked := map[types.UID]*gpu.PodAssignment{}
	for i := range pods {
		wg.Go(func() {
			uid := types.UID(fmt.Sprint("pod-", i))
			asg, reason, err := c.Reserve(a, uid, string(uid), "n1", req)
			if err != nil {
				t.Error(err)
				return
			}
			if reason.OK() {
				mu.Lock()
				booked[uid] = asg
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(booked) != 80 {
		t.Errorf("%d pods booked, want 80 (8 GPUs × 10 slices of 10 %%)", len(booked))
	}
	// An independent recount: every booked assignment re-added to a fresh node
	// must fit, which AddAssignment checks against the GPU limits.
	fresh, err := allocator.NewNode(schedtest.Inventory("n1", 8, 81920, true))
	if err != nil {
		t.Fatal(err)
	}
	for uid, asg := range booked {
		if err := fresh.AddAssignment(asg, 0, 0, 1.5); err != nil {
			t.Fatalf("pod %s: %v", uid, err)
		}
	}
	snap := c.Snapshot("n1")
	for i := range snap.GPUs {
		if snap.GPUs[i].CoresUsed() != fresh.GPUs[i].CoresUsed() || snap.GPUs[i].MemoryUsedMiB() != fresh.GPUs[i].MemoryUsedMiB() {
			t.Errorf("GPU %d: cache has %d‰/%d MiB, recount %d‰/%d MiB", i,
				snap.GPUs[i].CoresUsed(), snap.GPUs[i].MemoryUsedMiB(), fresh.GPUs[i].CoresUsed(), fresh.GPUs[i].MemoryUsedMiB())
		}
	}
	// Releasing concurrently returns every slice.
	for uid := range booked {
		wg.Go(func() { c.ForgetAssumed(uid) })
	}
	wg.Wait()
	snap = c.Snapshot("n1")
	for i := range snap.GPUs {
		if snap.GPUs[i].CoresUsed() != 0 || snap.GPUs[i].Tenants() != 0 {
			t.Errorf("GPU %d still holds %d‰ after every pod left", i, snap.GPUs[i].CoresUsed())
		}
	}
	if err := c.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestRebuildFromBoundPods: a restarted scheduler may see pods before their
// node's inventory; the bookings wait for it, vanish with it and return.
func TestRebuildFromBoundPods(t *testing.T) {
	c := New(1.5)
	whole := &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-n1-3", Index: 3, MemoryMiB: 81920, CoresPerMille: 1000}}}}}
	if err := c.AddBound("u1", "ns/p1", whole); err != nil {
		t.Fatal(err)
	}
	if got := c.Orphans(); len(got) != 1 || got[0] != "ns/p1" {
		t.Fatalf("orphans before the inventory = %v", got)
	}
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 8, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if got := c.Orphans(); len(got) != 0 {
		t.Fatalf("orphans after the inventory = %v", got)
	}
	if g := c.Snapshot("n1").GPUs[3]; g.CoresUsed() != 1000 {
		t.Fatalf("GPU 3 holds %d‰, want the whole GPU", g.CoresUsed())
	}
	// The same assignment seen again (resync) changes nothing.
	if err := c.AddBound("u1", "ns/p1", whole); err != nil {
		t.Fatal(err)
	}
	if g := c.Snapshot("n1").GPUs[3]; g.Tenants() != 1 {
		t.Fatalf("GPU 3 has %d tenants after a resync, want 1", g.Tenants())
	}
	// A second exclusive owner of the same GPU is refused, not booked.
	if err := c.AddBound("u2", "ns/p2", whole); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Fatalf("double exclusive booking: %v", err)
	}
	c.Forget("u2")
	c.RemoveNode("n1")
	if got := c.Orphans(); len(got) != 1 {
		t.Fatalf("orphans after the node left = %v", got)
	}
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 8, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if g := c.Snapshot("n1").GPUs[3]; g.CoresUsed() != 1000 {
		t.Fatalf("GPU 3 holds %d‰ after the node returned", g.CoresUsed())
	}
	// An inventory without that GPU keeps the pod booked (counted nowhere,
	// since its GPU is gone) and reports it.
	overfull, err := c.SetNode("v2", schedtest.Inventory("n1", 2, 81920, false))
	if err != nil || len(overfull) != 1 || len(c.Orphans()) != 0 {
		t.Fatalf("shrunk inventory: over-full %v, orphans %v, %v", overfull, c.Orphans(), err)
	}
}

// TestShrunkInventoryKeepsBookings: when a node's inventory changes so that
// the bookings of its running pods no longer fit (a GPU smaller, one gone,
// fewer slices), they are never dropped: the GPU is over-full and takes no
// second whole-GPU pod (issue 15: the dropped booking let one land at 200 %)
// until its pods leave. An assignment refused when first seen stays
// uncounted.
func TestShrunkInventoryKeepsBookings(t *testing.T) {
	c := New(1.5)
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	whole := func(i int) *gpu.PodAssignment {
		return &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
			GPUs: []gpu.GPUGrant{{UUID: fmt.Sprintf("GPU-n1-%d", i), Index: i, MemoryMiB: 81920, CoresPerMille: 1000}}}}}
	}
	for i := range 2 {
		if err := c.AddBound(types.UID(fmt.Sprint("u", i)), fmt.Sprint("ns/p", i), whole(i)); err != nil {
			t.Fatal(err)
		}
	}
	// A forged second owner of GPU 0: refused, never counted.
	if err := c.AddBound("forged", "ns/forged", whole(0)); err == nil {
		t.Fatal("a second exclusive owner was booked")
	}
	a := schedtest.NewAllocator(t)
	req := schedtest.WholeGPUs(1)
	fits := func() bool {
		reason, _, err := c.FitNode(a, n1, c.Shape("whole"), req)
		if err != nil {
			t.Fatal(err)
		}
		return reason.OK()
	}
	for _, tc := range []struct {
		name string
		inv  *gpu.NodeInventory
	}{
		{"GPUs report less memory", schedtest.Inventory("n1", 2, 40960, false)},
		{"GPUs offer one slice", func() *gpu.NodeInventory {
			inv := schedtest.Inventory("n1", 2, 81920, false)
			inv.GPUs[0].Slices, inv.GPUs[1].Slices = 1, 1
			return inv
		}()},
		{"GPU 1 gone", schedtest.Inventory("n1", 1, 40960, false)},
	} {
		overfull, err := c.SetNode(tc.name, tc.inv)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Orphans()) != 0 {
			t.Errorf("%s: orphans %v", tc.name, c.Orphans())
		}
		if fits() {
			t.Errorf("%s: a whole GPU still fits (over-full %v): a booking was dropped", tc.name, overfull)
		}
		if g := c.Snapshot("n1").GPUs[0]; g.CoresUsed() != 1000 || g.Tenants() != 1 {
			t.Errorf("%s: GPU 0 holds %d‰ and %d tenants, want p0's alone", tc.name, g.CoresUsed(), g.Tenants())
		}
	}
	// The GPUs are back as they were; p0 leaves: the refused record fits
	// now, and counts, as its node's agent now honours it; once it leaves
	// too, GPU 0 is free.
	if _, err := c.SetNode("v3", schedtest.Inventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	c.Forget("u0")
	if g := c.Snapshot("n1").GPUs[0]; g.CoresUsed() != 1000 || fits() {
		t.Fatalf("after p0 left, GPU 0 holds %d‰; want the formerly refused pod counted", g.CoresUsed())
	}
	c.Forget("forged")
	if !fits() {
		t.Fatalf("GPU 0 stays taken after its pods left: %d‰", c.Snapshot("n1").GPUs[0].CoresUsed())
	}
	if err := c.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestUnreserveAfterBindKeepsTheBooking: a late Unreserve must not release a
// pod the informer has already seen bound.
func TestUnreserveAfterBindKeepsTheBooking(t *testing.T) {
	c := New(1.5)
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	req := schedtest.WholeGPUs(1)
	asg, reason, err := c.Reserve(schedtest.NewAllocator(t), "u1", "ns/p", "n1", req)
	if err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	if err := c.AddBound("u1", "ns/p", asg); err != nil {
		t.Fatal(err)
	}
	c.ForgetAssumed("u1")
	if c.Snapshot("n1").GPUs[0].CoresUsed() != 1000 {
		t.Fatal("Unreserve after the bind released the GPU")
	}
	c.Forget("u1")
	if c.Snapshot("n1").GPUs[0].CoresUsed() != 0 {
		t.Fatal("deleting the pod did not release the GPU")
	}
}

// TestGonePodIsNotBookedAgain: once a pod is gone, an older event about it
// delivered late (the informer handler lagging the queue's hint) must not
// book its GPU again.
func TestGonePodIsNotBookedAgain(t *testing.T) {
	c := New(1.5)
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	whole := &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-n1-0", Index: 0, MemoryMiB: 81920, CoresPerMille: 1000}}}}}
	if err := c.AddBound("u1", "ns/p1", whole); err != nil {
		t.Fatal(err)
	}
	c.Gone("u1", false)
	if got := c.Snapshot("n1").GPUs[0].CoresUsed(); got != 0 {
		t.Fatalf("GPU holds %d‰ after its pod was gone", got)
	}
	if err := c.AddBound("u1", "ns/p1", whole); err != nil {
		t.Fatal(err)
	}
	if got := c.Snapshot("n1").GPUs[0].CoresUsed(); got != 0 {
		t.Fatalf("a late event booked a gone pod again: %d‰", got)
	}
	// Another pod may take the GPU.
	if err := c.AddBound("u2", "ns/p2", whole); err != nil {
		t.Fatal(err)
	}
	c.Gone("u2", false)
	c.Gone("u2", false) // reported twice (a relist)
	if got := c.Snapshot("n1").GPUs[0].CoresUsed(); got != 0 {
		t.Fatalf("GPU holds %d‰", got)
	}
}

// TestFitMemoFollowsTheNode: a memoized answer is never stale: booking on the
// node changes its version, and the next Fit places again.
func TestFitMemoFollowsTheNode(t *testing.T) {
	c := New(1.5)
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	a := schedtest.NewAllocator(t)
	whole := schedtest.WholeGPUs(1)
	reason, _, err := c.FitNode(a, n1, c.Shape(whole.Key()), whole)
	if err != nil || !reason.OK() {
		t.Fatalf("empty node: %v, %v", reason, err)
	}
	if _, reason, err := c.Reserve(a, "u1", "ns/p", "n1", whole); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	if reason, _, _ := c.FitNode(a, n1, c.Shape(whole.Key()), whole); reason.OK() {
		t.Fatal("memo answered for the empty node after its GPU was booked")
	}
	c.Forget("u1")
	if reason, _, _ := c.FitNode(a, n1, c.Shape(whole.Key()), whole); !reason.OK() {
		t.Fatalf("after release: %v", reason)
	}
}

// TestFitMemoWaysClash: two shapes that share a memo way evict each other,
// and each still gets its own answer.
func TestFitMemoWaysClash(t *testing.T) {
	c := New(1)
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	a := schedtest.NewAllocator(t)
	one, two := schedtest.WholeGPUs(1), schedtest.WholeGPUs(2)
	first := c.Shape(one.Key())
	for i := 1; i < memoWays; i++ {
		c.Shape(fmt.Sprintf("filler-%d", i))
	}
	second := c.Shape(two.Key())
	if int(first)%memoWays != int(second)%memoWays {
		t.Fatalf("shapes %d and %d do not share a way", first, second)
	}
	for range 3 {
		if reason, _, err := c.FitNode(a, n1, first, one); err != nil || !reason.OK() {
			t.Fatalf("one GPU on a one-GPU node: %v, %v", reason, err)
		}
		if reason, _, err := c.FitNode(a, n1, second, two); err != nil || reason.OK() {
			t.Fatalf("two GPUs on a one-GPU node: %v, %v", reason, err)
		}
	}
}

// TestFitMemoOutlivesTheWorkload: the workload tracker swaps allocators
// every few dozen pods. A request whose fit ignores the workload keeps its
// memoized fit across the swap (Filter places nothing again); one with two
// GPU containers, whose fit may depend on it, is placed again; Score always
// answers with the new workload's score.
func TestFitMemoOutlivesTheWorkload(t *testing.T) {
	c := New(1.5)
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 4, 81920, true)); err != nil {
		t.Fatal(err)
	}
	a := schedtest.NewAllocator(t)
	// One GPU partly taken, so the GPUs score apart.
	if _, reason, err := c.Reserve(a, "u1", "ns/p1", "n1", schedtest.SliceOf(gpu.ModeMPS, 30720, 30)); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	w, err := allocator.NewWorkload([]allocator.ShapeCount{{Request: schedtest.SliceOf(gpu.ModeMPS, 51200, 60), Count: 10}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := a.WithWorkload(w)
	one := schedtest.SliceOf(gpu.ModeMPS, 10240, 10)
	two := &allocator.Request{Sharing: gpu.ModeMPS, Containers: []allocator.Container{
		{Name: "a", Count: 1, MemoryMiB: 10240, Cores: 100}, {Name: "b", Count: 1, MemoryMiB: 10240, Cores: 100}}}
	for _, tc := range []struct {
		name        string
		req         *allocator.Request
		placesAgain bool
	}{{"one GPU container", one, false}, {"two GPU containers", two, true}} {
		shape := c.Shape(tc.req.Key())
		allocs := testing.AllocsPerRun(10, func() {
			for _, alloc := range []*allocator.Allocator{a, b} {
				if reason, _, err := c.FitNode(alloc, n1, shape, tc.req); err != nil || !reason.OK() {
					t.Fatalf("%s: %v, %v", tc.name, reason, err)
				}
			}
		})
		if placed := allocs > 0; placed != tc.placesAgain {
			t.Errorf("%s: Fit placed again after the workload changed: %v, want %v (%v allocations a round)", tc.name, placed, tc.placesAgain, allocs)
		}
	}
	shape := c.Shape(one.Key())
	c.FitNode(a, n1, shape, one)
	_, got, _ := c.ScoreNode(b, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, shape, one) // no carrier: found by name
	var pa, pb allocator.Placement
	a.Place(c.Snapshot("n1"), one, &pa)
	b.Place(c.Snapshot("n1"), one, &pb)
	if pa.Score == pb.Score {
		t.Fatalf("the two workloads score alike (%v): the test needs them apart", pa.Score)
	}
	if got != pb.Score {
		t.Errorf("Score after a workload swap: %v, want the new workload's %v (the old one gave %v)", got, pb.Score, pa.Score)
	}
}

// TestClusterExtentFollowsNodes: the largest GPU and the most GPUs of any
// node (what PreFilter refuses beyond) follow nodes joining, shrinking and
// leaving.
func TestClusterExtentFollowsNodes(t *testing.T) {
	c := New(1)
	check := func(step string, mem int64, most int) {
		t.Helper()
		if c.MaxGPUMemoryMiB() != mem || c.MostGPUs() != most {
			t.Fatalf("%s: largest GPU %d MiB, most GPUs %d; want %d, %d", step, c.MaxGPUMemoryMiB(), c.MostGPUs(), mem, most)
		}
	}
	check("empty", 0, 0)
	set := func(inv *gpu.NodeInventory) {
		t.Helper()
		if _, err := c.SetNode(fmt.Sprint(inv), inv); err != nil {
			t.Fatal(err)
		}
	}
	set(schedtest.Inventory("big", 2, 81920, false))
	set(schedtest.Inventory("wide", 8, 40960, false))
	check("two nodes", 81920, 8)
	set(schedtest.Inventory("wide", 4, 40960, false))
	check("the widest node shrank", 81920, 4)
	set(schedtest.Inventory("small", 1, 24576, false))
	c.RemoveNode("big")
	check("the node with the largest GPU left", 40960, 4)
	c.RemoveNode("wide")
	c.RemoveNode("small")
	check("all gone", 0, 0)
}

// TestSameInventory: a node update that left the inventory annotation alone
// is recognized without decoding, and the cache keeps the newer strings
// (annotation and name), so Behind's comparison and Filter's lookup share
// their bytes with the scheduler's snapshot.
func TestSameInventory(t *testing.T) {
	c := New(1)
	node := schedtest.InventoryNode(t, schedtest.Inventory("n1", 2, 81920, false))
	raw := node.Annotations[gpu.AnnotationInventory]
	if _, err := c.SetNode(raw, schedtest.Inventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	later := node.DeepCopy() // the same annotation, as a later node object carries it (decoded anew)
	again := strings.Clone(raw)
	later.Annotations[gpu.AnnotationInventory] = again
	later.Name = strings.Clone(node.Name)
	if !c.SameInventory(later) {
		t.Fatal("an equal annotation was not recognized")
	}
	if got := c.nodes["n1"].raw; unsafe.StringData(got) != unsafe.StringData(again) {
		t.Fatal("the cache kept the older copy of the annotation")
	}
	if got := c.nodes["n1"].carrier; got != later {
		t.Fatal("the cache did not remember the later object as carrying the inventory")
	}
	if c.byCarrier[later] != c.nodes["n1"] || len(c.byCarrier) != 1 {
		t.Fatalf("the node is not filed under the later object alone: %v", c.byCarrier)
	}
	for key := range c.nodes {
		if unsafe.StringData(key) != unsafe.StringData(later.Name) {
			t.Fatal("the cache keys the node by an older copy of its name")
		}
	}
	changed := node.DeepCopy()
	changed.Annotations[gpu.AnnotationInventory] += "y"
	other := node.DeepCopy()
	other.Name = "n2"
	if c.SameInventory(changed) || c.SameInventory(other) {
		t.Fatal("a changed annotation, or an unknown node, was taken as unchanged")
	}
	// The handler installs an equal inventory from a third object: it
	// becomes the carrier, with its own copy of the string.
	third := later.DeepCopy()
	third.Annotations[gpu.AnnotationInventory] = strings.Clone(raw)
	if _, err := c.SetNodeFrom(third, schedtest.Inventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if c.nodes["n1"].carrier != third || unsafe.StringData(c.nodes["n1"].raw) != unsafe.StringData(third.Annotations[gpu.AnnotationInventory]) {
		t.Fatal("an equal inventory installed from a newer object left the older object's string or carrier")
	}
	if !c.SameInventory(third) {
		t.Fatal("the carrier's own annotation was not recognized")
	}
	if err := c.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestBehind: the cache is behind the scheduler's snapshot of a node when it
// books slots for a pod the snapshot no longer counts, or the snapshot's
// node carries an inventory it has not installed — whether or not the
// snapshot's object is the one the handler saw.
func TestBehind(t *testing.T) {
	c := New(1)
	inv := schedtest.Inventory("n1", 2, 81920, false)
	seen := schedtest.InventoryNode(t, inv)
	if _, err := c.SetNodeFrom(seen, inv); err != nil { // as the handler installs it
		t.Fatal(err)
	}
	bound := schedtest.GPUPod(t, "p1", "n1", 0)
	if err := c.AddBound(bound.UID, "ml/p1", schedtest.Grant("n1", 0, 81920, 1000, gpu.ModeExclusive)); err != nil {
		t.Fatal(err)
	}
	copyOf := seen.DeepCopy() // an equal object the handler never saw
	newer := seen.DeepCopy()
	newer.Annotations[gpu.AnnotationInventory] = schedtest.InventoryNode(t, schedtest.Inventory("n1", 4, 81920, false)).Annotations[gpu.AnnotationInventory]
	unknown := schedtest.InventoryNode(t, schedtest.Inventory("n9", 1, 81920, false))
	bare := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n8"}}
	for _, tc := range []struct {
		name          string
		info          fwk.NodeInfo
		inventoryOnly bool // the refusal follows from the inventory alone
		want          bool
	}{
		{"the object the handler saw, with the pod", schedtest.SnapshotOf(seen, bound), false, false},
		{"an equal object, with the pod", schedtest.SnapshotOf(copyOf, bound), false, false},
		{"the pod already gone from the snapshot", schedtest.SnapshotOf(seen), false, true},
		{"the pod already gone, an inventory-only refusal", schedtest.SnapshotOf(seen), true, false},
		{"a newer inventory", schedtest.SnapshotOf(newer, bound), false, true},
		{"a newer inventory, an inventory-only refusal", schedtest.SnapshotOf(newer, bound), true, true},
		{"a node the cache has not installed", schedtest.SnapshotOf(unknown), true, true},
		{"a node without inventory", schedtest.SnapshotOf(bare), false, false},
	} {
		if got := c.Behind(tc.info, !tc.inventoryOnly); got != tc.want {
			t.Errorf("%s: Behind = %v, want %v", tc.name, got, tc.want)
		}
	}
	if err := c.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestVictimHeldUntilReclaimed: a preemption victim gone from the API server
// keeps its GPU booked until its node's inventory lists it as reclaimed; a
// pod that was no victim is released at once; the timeout releases a victim
// whose agent never answers.
func TestVictimHeldUntilReclaimed(t *testing.T) {
	c := New(1.5)
	inv := schedtest.Inventory("n1", 2, 81920, false)
	if _, err := c.SetNode("v1", inv); err != nil {
		t.Fatal(err)
	}
	whole := func(i int) *gpu.PodAssignment {
		return &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
			GPUs: []gpu.GPUGrant{{UUID: fmt.Sprintf("GPU-n1-%d", i), Index: i, MemoryMiB: 81920, CoresPerMille: 1000}}}}}
	}
	for i, uid := range []types.UID{"victim", "other"} {
		if err := c.AddBound(uid, "ns/"+string(uid), whole(i)); err != nil {
			t.Fatal(err)
		}
	}
	c.Gone("victim", true)
	c.Gone("other", false)
	gpus := c.Snapshot("n1").GPUs
	if gpus[0].CoresUsed() != 1000 || gpus[1].CoresUsed() != 0 {
		t.Fatalf("after both left: victim's GPU %d‰, other's %d‰; want the victim's still held", gpus[0].CoresUsed(), gpus[1].CoresUsed())
	}
	if c.AwaitingReclaim() != 1 {
		t.Fatalf("awaiting reclaim: %d", c.AwaitingReclaim())
	}
	c.Gone("victim", true) // the hint and the handler both report it
	inv.Reclaimed = []string{"victim"}
	if _, err := c.SetNode("v2", inv); err != nil {
		t.Fatal(err)
	}
	if got := c.Snapshot("n1").GPUs[0].CoresUsed(); got != 0 || c.AwaitingReclaim() != 0 {
		t.Fatalf("reclaimed victim still holds %d‰", got)
	}

	// An agent that never confirms: the timeout releases the slices.
	if err := c.AddBound("v2", "ns/v2", whole(1)); err != nil {
		t.Fatal(err)
	}
	c.Gone("v2", true)
	if got := c.ExpireReclaims(time.Now(), time.Hour); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	if got := c.ExpireReclaims(time.Now().Add(time.Hour), time.Hour); len(got) != 1 || c.Snapshot("n1").GPUs[1].CoresUsed() != 0 {
		t.Fatalf("expired %v; GPU holds %d‰", got, c.Snapshot("n1").GPUs[1].CoresUsed())
	}
	if err := c.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestFirstBoundAssignmentCounts: a bound pod's assignment patched after
// binding does not move its booking (issue 15: the booking moved while the
// pod kept its GPU); an assumed booking is still replaced by what the bound
// pod says.
func TestFirstBoundAssignmentCounts(t *testing.T) {
	c := New(1.5)
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 8, 81920, false)); err != nil {
		t.Fatal(err)
	}
	on := func(i int) *gpu.PodAssignment {
		return &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
			GPUs: []gpu.GPUGrant{{UUID: fmt.Sprintf("GPU-n1-%d", i), Index: i, MemoryMiB: 81920, CoresPerMille: 1000}}}}}
	}
	if err := c.AddBound("u1", "ns/p1", on(0)); err != nil {
		t.Fatal(err)
	}
	if err := c.AddBound("u1", "ns/p1", on(5)); !errors.Is(err, ErrAssignmentChanged) {
		t.Fatalf("changed assignment: %v, want ErrAssignmentChanged", err)
	}
	snap := c.Snapshot("n1")
	if snap.GPUs[0].CoresUsed() != 1000 || snap.GPUs[5].CoresUsed() != 0 {
		t.Fatalf("booking moved: GPU 0 %d‰, GPU 5 %d‰", snap.GPUs[0].CoresUsed(), snap.GPUs[5].CoresUsed())
	}
	// Reserve's booking is only assumed: the bound pod's record wins.
	req := schedtest.WholeGPUs(1)
	if _, reason, err := c.Reserve(schedtest.NewAllocator(t), "u2", "ns/p2", "n1", req); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	if err := c.AddBound("u2", "ns/p2", on(7)); err != nil {
		t.Fatal(err)
	}
	if got := c.Assignment("u2").Containers[0].GPUs[0].Index; got != 7 {
		t.Fatalf("assumed booking kept GPU %d over the bound pod's 7", got)
	}
	if err := c.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestStoppedCacheReportsNothing: once its scheduler's context ends, a cache
// writes no series — in one process a restarted scheduler's new cache owns
// them, and the old one's last in-flight cycle (here a Reserve and the
// Unreserve of a cancelled bind) overwrote them with bookings no pod held
// any more (the soak: "the scheduler books 9 slices" with every pod gone).
func TestStoppedCacheReportsNothing(t *testing.T) {
	c := New(1)
	ctx, stop := context.WithCancel(context.Background())
	var reports []string
	c.ReportUntil(ctx, func(name string, n *allocator.Node) {
		reports = append(reports, fmt.Sprintf("%s:%d", name, n.GPUs[0].Tenants()))
	}, func(name string, _ []allocator.GPU) { reports = append(reports, name+" gone") })
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	a := schedtest.NewAllocator(t)
	req := schedtest.SliceOf(gpu.ModeAuto, 8192, 10)
	if _, r, err := c.Reserve(a, "u1", "ns/p1", "n1", req); err != nil || !r.OK() {
		t.Fatalf("reserve: %v %v", r, err)
	}
	stop()
	if _, r, err := c.Reserve(a, "u2", "ns/p2", "n1", req); err != nil || !r.OK() {
		t.Fatalf("reserve after stop: %v %v", r, err)
	}
	c.ForgetAssumed("u2")
	c.RemoveNode("n1")
	if got := strings.Join(reports, " "); got != "n1:0 n1:1" {
		t.Fatalf("reports %q, want only those before the stop (n1:0 n1:1)", got)
	}
}

// TestFitNodeByCarrier: a node found by its object's address is the state
// the cache holds for its name, whatever happened to the node since: a new
// inventory (a fresh state), a newer object, the node's removal. A stale
// entry would answer from usage the cache no longer has.
func TestFitNodeByCarrier(t *testing.T) {
	a := schedtest.NewAllocator(t)
	whole := schedtest.WholeGPUs(2)
	c := New(1)
	first := schedtest.InventoryNode(t, schedtest.Inventory("n1", 2, 81920, false))
	if _, err := c.SetNodeFrom(first, schedtest.Inventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	shape := c.Shape(whole.Key())
	if reason, slots, err := c.FitNode(a, first, shape, whole); err != nil || !reason.OK() || slots != 16 {
		t.Fatalf("two whole GPUs on an empty two-GPU node: %v, %d slots, %v; want fits, its 16 slots", reason, slots, err)
	}
	// One GPU fewer: a new state; the first object must not reach the old one.
	second := schedtest.InventoryNode(t, schedtest.Inventory("n1", 1, 81920, false))
	if _, err := c.SetNodeFrom(second, schedtest.Inventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		obj   *v1.Node
		slots int64 // -1: the cache has not read this object's
	}{{first, -1}, {second, 8}} {
		if reason, slots, err := c.FitNode(a, tc.obj, shape, whole); err != nil || reason.Code != allocator.NotEnoughWholeGPUs || slots != tc.slots {
			t.Fatalf("two whole GPUs on a one-GPU node, asked with %p: %v, %d slots, %v; want %v, %d slots", tc.obj, reason, slots, err, allocator.NotEnoughWholeGPUs, tc.slots)
		}
	}
	if len(c.byCarrier) != 1 || c.byCarrier[second] == nil {
		t.Fatalf("byCarrier holds %d entries, want the second object's alone", len(c.byCarrier))
	}
	// A booking changes the answer read through the carrier (the memo's
	// version mirror follows it).
	one := schedtest.WholeGPUs(1)
	oneShape := c.Shape(one.Key())
	if reason, _, err := c.FitNode(a, second, oneShape, one); err != nil || !reason.OK() {
		t.Fatalf("one whole GPU on an empty one-GPU node: %v, %v", reason, err)
	}
	if _, reason, err := c.Reserve(a, "p1", "ns/p1", "n1", one); err != nil || !reason.OK() {
		t.Fatalf("reserve: %v, %v", reason, err)
	}
	if reason, _, err := c.FitNode(a, second, oneShape, one); err != nil || reason.OK() {
		t.Fatalf("one whole GPU on a full node: %v, %v", reason, err)
	}
	c.Forget("p1")
	if reason, _, err := c.FitNode(a, second, oneShape, one); err != nil || !reason.OK() {
		t.Fatalf("one whole GPU after the booking left: %v, %v", reason, err)
	}
	c.RemoveNode("n1")
	if _, _, err := c.FitNode(a, second, oneShape, one); err == nil {
		t.Fatal("a removed node's object still found its state")
	}
	if len(c.byCarrier) != 0 {
		t.Fatalf("byCarrier holds %d entries after the node left", len(c.byCarrier))
	}
	if err := c.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

// n1 is a node object the caches under test never saw carrying an
// inventory: FitNode finds "n1" by its name.
var n1 = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}

// TestLiveSlotsFollowBookings: the slots the cache counts per node for live
// pods (what Behind compares with the scheduler's snapshot) stay equal to
// those of its bookings through every kind of change.
func TestLiveSlotsFollowBookings(t *testing.T) {
	c := New(1)
	a := schedtest.NewAllocator(t)
	check := func(step string) {
		t.Helper()
		if err := c.checkInvariants(); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	if _, err := c.SetNode("v1", schedtest.Inventory("n1", 4, 81920, false)); err != nil {
		t.Fatal(err)
	}
	two := schedtest.WholeGPUs(2)
	if _, r, err := c.Reserve(a, "r1", "ml/r1", "n1", two); err != nil || !r.OK() {
		t.Fatalf("reserve: %v %v", r, err)
	}
	check("reserve")
	if err := c.AddBound("b1", "ml/b1", schedtest.Grant("n1", 3, 81920, 1000, gpu.ModeExclusive)); err != nil {
		t.Fatal(err)
	}
	check("bound")
	c.Gone("b1", true) // a victim: booked until reclaimed
	check("victim gone")
	if _, err := c.SetNode("v2", schedtest.Inventory("n1", 4, 81920, false)); err != nil {
		t.Fatal(err)
	}
	check("inventory replaced")
	if expired := c.ExpireReclaims(c.pods["b1"].goneAt.Add(goneTTL), 0); len(expired) != 1 {
		t.Fatalf("expired %v", expired)
	}
	check("reclaim expired")
	c.ForgetAssumed("r1")
	check("unreserve")
	if s := c.nodes["n1"]; s.liveSlots != 0 {
		t.Fatalf("%d live slots on an empty node", s.liveSlots)
	}
}

// checkInvariants says what is wrong with the cache's indexes, if anything:
// the address index is a subset of the name index (each carrier files the
// state the name holds, and the state names it as its carrier, with raw its
// own annotation); each node's live slots are those of its live bookings;
// the refused index holds only records of pods.
func (c *Cache) checkInvariants() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for carrier, s := range c.byCarrier {
		if c.nodes[carrier.Name] != s {
			return fmt.Errorf("byCarrier files node %s under an object whose name does not hold that state", carrier.Name)
		}
		if s.carrier != carrier {
			return fmt.Errorf("byCarrier files node %s under an object that is not its carrier", carrier.Name)
		}
	}
	for name, s := range c.nodes {
		if s.carrier == nil {
			continue
		}
		if c.byCarrier[s.carrier] != s {
			return fmt.Errorf("node %s's carrier is not filed in byCarrier", name)
		}
		if raw := s.carrier.Annotations[gpu.AnnotationInventory]; raw != s.raw || unsafe.StringData(raw) != unsafe.StringData(s.raw) {
			return fmt.Errorf("node %s's raw is not its carrier's annotation string", name)
		}
	}
	want := map[string]int64{}
	for _, rec := range c.pods {
		if rec.booked && !rec.awaitingReclaim {
			want[rec.assignment.Node] += slots(rec.assignment)
		}
	}
	for name, s := range c.nodes {
		if s.liveSlots != want[name] {
			return fmt.Errorf("node %s counts %d live slots, its bookings %d", name, s.liveSlots, want[name])
		}
	}
	for uid, rec := range c.refused {
		if c.pods[uid] != rec && rec.refused {
			return fmt.Errorf("refused record %s is no pod's", rec.name)
		}
	}
	return nil
}
