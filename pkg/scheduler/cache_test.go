package scheduler

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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metricstestutil "k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

func testInventory(node string, gpus int, memMiB int64, mps bool) *gpu.NodeInventory {
	inv := &gpu.NodeInventory{Node: node, CPUMilli: 64000, MemoryMiB: 512 << 10}
	for i := range gpus {
		inv.GPUs = append(inv.GPUs, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Model: "H100", MemoryMiB: memMiB, Healthy: true, MPSCapable: mps})
	}
	return inv
}

// wholeGPUs is what podgpu.Request reads from one container asking for n
// whole GPUs (tessera.dev/gpu: n).
func wholeGPUs(n int) *allocator.Request {
	return &allocator.Request{Sharing: gpu.ModeAuto, Containers: []allocator.Container{{Name: "m", Count: n, Whole: true}}}
}

// sliceOf is what podgpu.Request reads from one container asking for a
// slice of one GPU: memMiB and coresPercent of its SMs, in mode.
func sliceOf(mode gpu.SharingMode, memMiB int64, coresPercent int) *allocator.Request {
	return &allocator.Request{Sharing: mode, Containers: []allocator.Container{{Name: "m", Count: 1, MemoryMiB: memMiB, Cores: coresPercent * gpu.CoresPerGPU / 100}}}
}

func newAllocator(t testing.TB) *allocator.Allocator {
	t.Helper()
	cfg := config.Default().Allocator
	a, err := allocator.New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestConcurrentReserveNeverOverbooks: many cycles and binding goroutines
// booking one node at once must never exceed a GPU's limits, and every
// booking that succeeded must be counted exactly once.
func TestConcurrentReserveNeverOverbooks(t *testing.T) {
	c := NewCache(1.5)
	if _, err := c.SetNode("a", testInventory("n1", 8, 81920, true)); err != nil {
		t.Fatal(err)
	}
	a := newAllocator(t)
	req := sliceOf(gpu.ModeMPS, 8192, 10)
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
	fresh, err := allocator.NewNode(testInventory("n1", 8, 81920, true))
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
}

// TestRebuildFromBoundPods: a restarted scheduler may see pods before their
// node's inventory; the bookings wait for it, vanish with it and return.
func TestRebuildFromBoundPods(t *testing.T) {
	c := NewCache(1.5)
	whole := &gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-n1-3", Index: 3, MemoryMiB: 81920, CoresPerMille: 1000}}}}}
	if err := c.AddBound("u1", "ns/p1", whole); err != nil {
		t.Fatal(err)
	}
	if got := c.Orphans(); len(got) != 1 || got[0] != "ns/p1" {
		t.Fatalf("orphans before the inventory = %v", got)
	}
	if _, err := c.SetNode("v1", testInventory("n1", 8, 81920, false)); err != nil {
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
	if _, err := c.SetNode("v1", testInventory("n1", 8, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if g := c.Snapshot("n1").GPUs[3]; g.CoresUsed() != 1000 {
		t.Fatalf("GPU 3 holds %d‰ after the node returned", g.CoresUsed())
	}
	// An inventory without that GPU keeps the pod booked (counted nowhere,
	// since its GPU is gone) and reports it.
	overfull, err := c.SetNode("v2", testInventory("n1", 2, 81920, false))
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
	c := NewCache(1.5)
	if _, err := c.SetNode("v1", testInventory("n1", 2, 81920, false)); err != nil {
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
	a := newAllocator(t)
	req := wholeGPUs(1)
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
		{"GPUs report less memory", testInventory("n1", 2, 40960, false)},
		{"GPUs offer one slice", func() *gpu.NodeInventory {
			inv := testInventory("n1", 2, 81920, false)
			inv.GPUs[0].Slices, inv.GPUs[1].Slices = 1, 1
			return inv
		}()},
		{"GPU 1 gone", testInventory("n1", 1, 40960, false)},
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
	if _, err := c.SetNode("v3", testInventory("n1", 2, 81920, false)); err != nil {
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
}

// TestUnreserveAfterBindKeepsTheBooking: a late Unreserve must not release a
// pod the informer has already seen bound.
func TestUnreserveAfterBindKeepsTheBooking(t *testing.T) {
	c := NewCache(1.5)
	if _, err := c.SetNode("v1", testInventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	req := wholeGPUs(1)
	asg, reason, err := c.Reserve(newAllocator(t), "u1", "ns/p", "n1", req)
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

func TestNormalizeScoreKeepsTheBestUnique(t *testing.T) {
	p := &Plugin{}
	scores := fwk.NodeScoreList{{Name: "a", Score: 57_000_000}, {Name: "b", Score: 57_001_000}, {Name: "c", Score: 0}, {Name: "d", Score: 57_001_000}}
	if st := p.NormalizeScore(nil, nil, nil, scores); st != nil {
		t.Fatal(st)
	}
	want := []int64{98, 100, 0, 100}
	for i, s := range scores {
		if s.Score != want[i] {
			t.Errorf("%s: %d, want %d", s.Name, s.Score, want[i])
		}
	}
	same := fwk.NodeScoreList{{Name: "a", Score: 5}, {Name: "b", Score: 5}}
	p.NormalizeScore(nil, nil, nil, same)
	if same[0].Score != 100 || same[1].Score != 100 {
		t.Errorf("equal scores: %v", same)
	}
}

func TestDecodeArgs(t *testing.T) {
	got, err := DecodeArgs(&runtime.Unknown{Raw: []byte("policy: binpack\nmemoryOversubscription: 1.2\n"), ContentType: runtime.ContentTypeYAML})
	if err != nil {
		t.Fatal(err)
	}
	if got.Policy != config.PolicyBinpack || got.MemoryOversubscription != 1.2 || got.MinSliceMiB.Training != 8192 {
		t.Errorf("decoded %+v", got)
	}
	if got, err := DecodeArgs(nil); err != nil || got.Policy != config.DefaultPolicy {
		t.Errorf("no args: %+v, %v", got, err)
	}
	_, err = DecodeArgs(&runtime.Unknown{Raw: []byte(`{"policy":"x","memoryOversubscription":3}`)})
	for _, want := range []string{"pluginConfig[TesseraGPU].args.policy", "pluginConfig[TesseraGPU].args.memoryOversubscription"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to name %s", err, want)
		}
	}
	// A value written as 0 is refused by its name, not replaced by the
	// default (recordRetention: 0 used to become 100).
	for raw, want := range map[string]string{
		`{"preemption":{"recordRetention":0}}`: "pluginConfig[TesseraGPU].args.preemption.recordRetention: invalid value 0",
		`{"memoryOversubscription":0}`:         "pluginConfig[TesseraGPU].args.memoryOversubscription: invalid value 0",
		`{"minSliceMiB":{"training":0}}`:       "pluginConfig[TesseraGPU].args.minSliceMiB.training: invalid value 0",
	} {
		if _, err := DecodeArgs(&runtime.Unknown{Raw: []byte(raw)}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", raw, err, want)
		}
	}
	if c, err := decodeArgs(&runtime.Unknown{Raw: []byte(`{"preemption":{"gracePeriod":"10s"}}`)}); err != nil ||
		c.Preemption.GracePeriod.Duration != 10*time.Second || c.Preemption.RecordRetention != config.DefaultRecordRetention {
		t.Errorf("a preemption section with one field: %+v, %v", c, err)
	}
}

func TestWorkloadTrackerFollowsTheMix(t *testing.T) {
	base := newAllocator(t)
	tr := newWorkloadTracker(base, 0.95)
	if tr.Current() != base {
		t.Fatal("a fresh tracker should score with the base allocator")
	}
	small := sliceOf(gpu.ModeAuto, 8192, 10)
	tr.Observe(small)
	first := tr.Current()
	if first == base {
		t.Fatal("the first observation should build a workload")
	}
	for range refreshEvery {
		tr.Observe(small)
	}
	if tr.Current() == first {
		t.Fatal("refreshEvery observations should rebuild the workload")
	}
	for range workloadWindow * 2 {
		tr.Observe(small)
	}
	if len(tr.ring) != workloadWindow || tr.counts[small.Key()].Count != workloadWindow {
		t.Fatalf("window holds %d requests, count %v", len(tr.ring), tr.counts[small.Key()].Count)
	}
}

// TestGonePodIsNotBookedAgain: once a pod is gone, an older event about it
// delivered late (the informer handler lagging the queue's hint) must not
// book its GPU again.
func TestGonePodIsNotBookedAgain(t *testing.T) {
	c := NewCache(1.5)
	if _, err := c.SetNode("v1", testInventory("n1", 1, 81920, false)); err != nil {
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
	c := NewCache(1.5)
	if _, err := c.SetNode("v1", testInventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	a := newAllocator(t)
	whole := wholeGPUs(1)
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
	c := NewCache(1)
	if _, err := c.SetNode("v1", testInventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	a := newAllocator(t)
	one, two := wholeGPUs(1), wholeGPUs(2)
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
	c := NewCache(1.5)
	if _, err := c.SetNode("v1", testInventory("n1", 4, 81920, true)); err != nil {
		t.Fatal(err)
	}
	a := newAllocator(t)
	// One GPU partly taken, so the GPUs score apart.
	if _, reason, err := c.Reserve(a, "u1", "ns/p1", "n1", sliceOf(gpu.ModeMPS, 30720, 30)); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	w, err := allocator.NewWorkload([]allocator.ShapeCount{{Request: sliceOf(gpu.ModeMPS, 51200, 60), Count: 10}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	b := a.WithWorkload(w)
	one := sliceOf(gpu.ModeMPS, 10240, 10)
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
	c := NewCache(1)
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
	set(testInventory("big", 2, 81920, false))
	set(testInventory("wide", 8, 40960, false))
	check("two nodes", 81920, 8)
	set(testInventory("wide", 4, 40960, false))
	check("the widest node shrank", 81920, 4)
	set(testInventory("small", 1, 24576, false))
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
	c := NewCache(1)
	node := inventoryNode(t, testInventory("n1", 2, 81920, false))
	raw := node.Annotations[gpu.AnnotationInventory]
	if _, err := c.SetNode(raw, testInventory("n1", 2, 81920, false)); err != nil {
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
}

// TestBehind: the cache is behind the scheduler's snapshot of a node when it
// books slots for a pod the snapshot no longer counts, or the snapshot's
// node carries an inventory it has not installed — whether or not the
// snapshot's object is the one the handler saw.
func TestBehind(t *testing.T) {
	c := NewCache(1)
	inv := testInventory("n1", 2, 81920, false)
	seen := inventoryNode(t, inv)
	if _, err := c.SetNodeFrom(seen, inv); err != nil { // as the handler installs it
		t.Fatal(err)
	}
	bound := gpuPod(t, "p1", "n1", 0)
	if err := c.AddBound(bound.UID, "ml/p1", grant("n1", 0, 81920, 1000, gpu.ModeExclusive)); err != nil {
		t.Fatal(err)
	}
	copyOf := seen.DeepCopy() // an equal object the handler never saw
	newer := seen.DeepCopy()
	newer.Annotations[gpu.AnnotationInventory] = inventoryNode(t, testInventory("n1", 4, 81920, false)).Annotations[gpu.AnnotationInventory]
	unknown := inventoryNode(t, testInventory("n9", 1, 81920, false))
	bare := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n8"}}
	for _, tc := range []struct {
		name          string
		info          fwk.NodeInfo
		inventoryOnly bool // the refusal follows from the inventory alone
		want          bool
	}{
		{"the object the handler saw, with the pod", snapshotOf(seen, bound), false, false},
		{"an equal object, with the pod", snapshotOf(copyOf, bound), false, false},
		{"the pod already gone from the snapshot", snapshotOf(seen), false, true},
		{"the pod already gone, an inventory-only refusal", snapshotOf(seen), true, false},
		{"a newer inventory", snapshotOf(newer, bound), false, true},
		{"a newer inventory, an inventory-only refusal", snapshotOf(newer, bound), true, true},
		{"a node the cache has not installed", snapshotOf(unknown), true, true},
		{"a node without inventory", snapshotOf(bare), false, false},
	} {
		if got := c.Behind(tc.info, !tc.inventoryOnly); got != tc.want {
			t.Errorf("%s: Behind = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestWithoutTesseraResources(t *testing.T) {
	lim := v1.ResourceList{"tessera.dev/gpu": resource.MustParse("1"), "tessera.dev/gpu-memory": resource.MustParse("8192"),
		v1.ResourceCPU: resource.MustParse("2"), "example.com/fpga": resource.MustParse("1")}
	pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{Limits: lim, Requests: lim.DeepCopy()}}}}}
	got := withoutTesseraResources(pod)
	for _, l := range []v1.ResourceList{got.Spec.Containers[0].Resources.Limits, got.Spec.Containers[0].Resources.Requests} {
		if _, ok := l["tessera.dev/gpu"]; ok || len(l) != 2 {
			t.Fatalf("stripped resources %v, want cpu and example.com/fpga only", l)
		}
	}
	if len(pod.Spec.Containers[0].Resources.Limits) != 4 {
		t.Fatal("the scheduler's pod was modified")
	}
	plain := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "m"}}}}
	if withoutTesseraResources(plain) != plain {
		t.Fatal("a pod without tessera.dev resources was copied")
	}
}

// TestVictimHeldUntilReclaimed: a preemption victim gone from the API server
// keeps its GPU booked until its node's inventory lists it as reclaimed; a
// pod that was no victim is released at once; the timeout releases a victim
// whose agent never answers.
func TestVictimHeldUntilReclaimed(t *testing.T) {
	c := NewCache(1.5)
	inv := testInventory("n1", 2, 81920, false)
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
}

// TestFirstBoundAssignmentCounts: a bound pod's assignment patched after
// binding does not move its booking (issue 15: the booking moved while the
// pod kept its GPU); an assumed booking is still replaced by what the bound
// pod says.
func TestFirstBoundAssignmentCounts(t *testing.T) {
	c := NewCache(1.5)
	if _, err := c.SetNode("v1", testInventory("n1", 8, 81920, false)); err != nil {
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
	req := wholeGPUs(1)
	if _, reason, err := c.Reserve(newAllocator(t), "u2", "ns/p2", "n1", req); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	if err := c.AddBound("u2", "ns/p2", on(7)); err != nil {
		t.Fatal(err)
	}
	if got := c.Assignment("u2").Containers[0].GPUs[0].Index; got != 7 {
		t.Fatalf("assumed booking kept GPU %d over the bound pod's 7", got)
	}
}

// TestUnreadableInventoryReason: a node whose inventory annotation is
// garbage tells its pods so (why is in the node's event), instead of asking whether the agent
// runs there; a readable one clears it.
func TestUnreadableInventoryReason(t *testing.T) {
	p := &Plugin{shared: &shared{cache: NewCache(1.5)}}
	logger := klog.Background()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "n1", Annotations: map[string]string{gpu.AnnotationInventory: `{"v":"v1","gpus":[{"uuid":`}}}
	p.onNode(logger, node)
	if got := p.noInventoryReason("n1"); !strings.Contains(got, "GPU inventory (annotation tessera.dev/inventory) is unreadable (see the node's InvalidGPUInventory event)") ||
		strings.Contains(got, "is tessera-agent running there") {
		t.Fatalf("reason %q", got)
	}
	if got := p.noInventoryReason("n2"); !strings.Contains(got, "is tessera-agent running there?") {
		t.Fatalf("node without inventory: %q", got)
	}
	raw, err := gpu.EncodeInventory(testInventory("n1", 1, 81920, false))
	if err != nil {
		t.Fatal(err)
	}
	node.Annotations[gpu.AnnotationInventory] = string(raw)
	p.onNode(logger, node)
	if _, ok := p.unreadable.Load("n1"); ok || !p.cache.HasNode("n1") {
		t.Fatal("a readable inventory did not replace the unreadable one")
	}
}

// TestStaleSeriesGo: a GPU that leaves a node's inventory loses its series,
// and the orphan gauge follows pods that leave (issue 15: series stayed
// forever, and orphaned_pods stayed at 6 after the pods were gone).
func TestStaleSeriesGo(t *testing.T) {
	registerMetrics()
	p := &Plugin{shared: &shared{cache: NewCache(1.5)}}
	var gone []string
	p.cache.reportUntil(context.Background(), nil, func(name string, gpus []allocator.GPU) {
		for _, g := range gpus {
			gone = append(gone, name+"/"+g.UUID)
		}
	})
	if _, err := p.cache.SetNode("v1", testInventory("n1", 3, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.cache.SetNode("v2", testInventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(gone) != "[n1/GPU-n1-2]" {
		t.Fatalf("series dropped for %v, want GPU-n1-2's", gone)
	}

	logger := klog.Background()
	a, _ := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "elsewhere", Containers: []gpu.ContainerAssignment{{Name: "m", Mode: gpu.ModeExclusive,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-x", MemoryMiB: 81920, CoresPerMille: 1000}}}}})
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1", Annotations: map[string]string{gpu.AnnotationAssignment: a}},
		Spec: v1.PodSpec{NodeName: "elsewhere", Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{gpu.ResourceGPU: resource.MustParse("1")}}}}}}
	p.onPod(logger, pod, false)
	if v, _ := metricstestutil.GetGaugeMetricValue(orphanedPods); v != 1 {
		t.Fatalf("orphaned_pods = %v with one pod on a node without inventory", v)
	}
	p.onPodDelete(pod)
	if v, _ := metricstestutil.GetGaugeMetricValue(orphanedPods); v != 0 {
		t.Fatalf("orphaned_pods = %v after the pod left", v)
	}
}

// TestStoppedCacheReportsNothing: once its scheduler's context ends, a cache
// writes no series — in one process a restarted scheduler's new cache owns
// them, and the old one's last in-flight cycle (here a Reserve and the
// Unreserve of a cancelled bind) overwrote them with bookings no pod held
// any more (the soak: "the scheduler books 9 slices" with every pod gone).
func TestStoppedCacheReportsNothing(t *testing.T) {
	c := NewCache(1)
	ctx, stop := context.WithCancel(context.Background())
	var reports []string
	c.reportUntil(ctx, func(name string, n *allocator.Node) {
		reports = append(reports, fmt.Sprintf("%s:%d", name, n.GPUs[0].Tenants()))
	}, func(name string, _ []allocator.GPU) { reports = append(reports, name+" gone") })
	if _, err := c.SetNode("v1", testInventory("n1", 1, 81920, false)); err != nil {
		t.Fatal(err)
	}
	a := newAllocator(t)
	req := sliceOf(gpu.ModeAuto, 8192, 10)
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
	a := newAllocator(t)
	whole := wholeGPUs(2)
	c := NewCache(1)
	first := inventoryNode(t, testInventory("n1", 2, 81920, false))
	if _, err := c.SetNodeFrom(first, testInventory("n1", 2, 81920, false)); err != nil {
		t.Fatal(err)
	}
	shape := c.Shape(whole.Key())
	if reason, slots, err := c.FitNode(a, first, shape, whole); err != nil || !reason.OK() || slots != 16 {
		t.Fatalf("two whole GPUs on an empty two-GPU node: %v, %d slots, %v; want fits, its 16 slots", reason, slots, err)
	}
	// One GPU fewer: a new state; the first object must not reach the old one.
	second := inventoryNode(t, testInventory("n1", 1, 81920, false))
	if _, err := c.SetNodeFrom(second, testInventory("n1", 1, 81920, false)); err != nil {
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
	one := wholeGPUs(1)
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
}

// n1 is a node object the caches under test never saw carrying an
// inventory: FitNode finds "n1" by its name.
var n1 = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
