package scheduler

import (
	"context"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// TestCandidates: the nodes a shape is tried on are those whose inventory
// could hold it empty, plus those without a usable inventory; they follow
// inventories coming, changing and leaving.
func TestCandidates(t *testing.T) {
	c := NewCache(1)
	a := newAllocator(t)
	set := func(inv *gpu.NodeInventory) {
		t.Helper()
		raw, err := gpu.EncodeInventory(inv)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.SetNode(string(raw), inv); err != nil {
			t.Fatal(err)
		}
	}
	set(testInventory("mps", 2, 81920, true))
	set(testInventory("ts", 2, 81920, false))
	c.SetBare("cpu", true)
	mpsSlice, whole, three := sliceOf(gpu.ModeMPS, 10240, 20), wholeGPUs(1), wholeGPUs(3)
	names := func(x *candidates) []string {
		if x.nodes == nil {
			return nil
		}
		out := x.nodes.UnsortedList()
		slices.Sort(out)
		return out
	}
	check := func(step string, r *allocator.Request, want []string, excluded map[string]allocator.Code) {
		t.Helper()
		got := c.Candidates(a, c.Shape(r.Key()), r)
		if !slices.Equal(names(got), want) {
			t.Errorf("%s: candidates %v, want %v", step, names(got), want)
		}
		have := map[string]allocator.Code{}
		for _, x := range got.excluded {
			have[x.name] = x.reason.Code
		}
		if len(have) != len(excluded) {
			t.Errorf("%s: excluded %v, want %v", step, have, excluded)
		}
		for n, code := range excluded {
			if have[n] != code {
				t.Errorf("%s: %s excluded for %v, want %v", step, n, have[n], code)
			}
		}
		if got.known != 3 {
			t.Errorf("%s: %d nodes known, want 3", step, got.known)
		}
	}
	check("an MPS slice", mpsSlice, []string{"cpu", "mps"}, map[string]allocator.Code{"ts": allocator.NoMPS})
	check("a whole GPU: every node may", whole, nil, nil)
	check("more GPUs than a node has", three, []string{"cpu"}, map[string]allocator.Code{"mps": allocator.NotEnoughWholeGPUs, "ts": allocator.NotEnoughWholeGPUs})
	// A booking changes nothing: candidates look at the empty node.
	if _, reason, err := c.Reserve(a, "u1", "ml/p", "mps", whole); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	check("after a booking", mpsSlice, []string{"cpu", "mps"}, map[string]allocator.Code{"ts": allocator.NoMPS})
	set(testInventory("ts", 2, 81920, true)) // its GPUs now run MPS
	check("the other node turned MPS-capable", mpsSlice, nil, nil)
	c.RemoveNode("ts")
	c.SetBare("ts", true)
	check("its inventory gone", three, []string{"cpu", "ts"}, map[string]allocator.Code{"mps": allocator.NotEnoughWholeGPUs})
}

// TestPreFilterNamesCandidates: PreFilter restricts the cycle to the
// candidates, except when the scheduler's snapshot has nodes the cache has
// not seen; when no node fits, PostFilter counts the nodes left out and
// marks the cycle behind where the snapshot shows an inventory the cache
// has not applied.
func TestPreFilterNamesCandidates(t *testing.T) {
	p := hintPlugin(t, &fakeQueue{})
	mpsNode, tsNode := inventoryNode(t, testInventory("mps", 1, 81920, true)), inventoryNode(t, testInventory("ts", 1, 81920, false))
	for _, n := range []*v1.Node{mpsNode, tsNode} {
		inv, _ := gpu.DecodeInventory([]byte(n.Annotations[gpu.AnnotationInventory]))
		if _, err := p.cache.SetNode(n.Annotations[gpu.AnnotationInventory], inv); err != nil {
			t.Fatal(err)
		}
	}
	// Node mps's one GPU is taken whole: the MPS slice fits nowhere.
	if _, reason, err := p.cache.Reserve(newAllocator(t), "holder", "ml/holder", "mps", wholeGPUs(1)); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	pod := gpuPod(t, "slice", "", 0)
	pod.Annotations[gpu.AnnotationSharing] = string(gpu.ModeMPS)
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceMemory] = resource.MustParse("10240")
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceCores] = resource.MustParse("20")
	ctx := context.Background()
	infos := []fwk.NodeInfo{snapshotOf(mpsNode, gpuPod(t, "holder", "mps", 0)), snapshotOf(tsNode)}

	state := framework.NewCycleState()
	res, st := p.PreFilter(ctx, state, pod, infos)
	if !st.IsSuccess() || res == nil || !res.NodeNames.Equal(sets.New("mps")) {
		t.Fatalf("PreFilter = %v, %v; want only node mps", res, st)
	}
	if res, _ := p.PreFilter(ctx, framework.NewCycleState(), pod, append(infos, snapshotOf(inventoryNode(t, testInventory("new", 1, 81920, false))))); res != nil {
		t.Fatalf("with a node the cache has not seen, PreFilter restricted the cycle to %v", res.NodeNames)
	}

	// The scheduler's snapshot already shows node ts with MPS GPUs; the
	// cache has not applied it.
	tsNow := inventoryNode(t, testInventory("ts", 1, 81920, true))
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil, frameworkruntime.WithSnapshotSharedLister(internalcache.NewSnapshot(nil, []*v1.Node{mpsNode, tsNow})))
	if err != nil {
		t.Fatal(err)
	}
	p.handle = fh
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set("mps", p.Filter(ctx, state, pod, infos[0]))
	if readState(state).rejected.behind.Load() {
		t.Fatal("Filter on node mps, which the cache has as the snapshot does, marked the cycle behind")
	}
	statuses.SetAbsentNodesStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node(s) didn't satisfy plugin(s) [TesseraGPU]"))
	_, st = p.PostFilter(ctx, state, pod, statuses)
	s := readState(state)
	if !s.rejected.behind.Load() {
		t.Error("a left-out node whose new inventory the cache has not applied did not mark the cycle behind")
	}
	if line := s.rejected.summary(); !strings.Contains(line, "1 MPS-capable GPUs") {
		t.Errorf("PostFilter's line %q does not count the node left out for its lack of MPS", line)
	}
	t.Logf("PostFilter: %v", st)
}

// TestTooManyGPUsWaitsForTheCache: a pod refused for asking more GPUs than
// any node has, while the scheduler's snapshot already shows a larger
// inventory the cache has not applied, waits for the handler to apply it
// (and is activated then) rather than for an event that already passed.
func TestTooManyGPUsWaitsForTheCache(t *testing.T) {
	q := &fakeQueue{}
	p := hintPlugin(t, q)
	small := inventoryNode(t, testInventory("n1", 1, 81920, false))
	inv, _ := gpu.DecodeInventory([]byte(small.Annotations[gpu.AnnotationInventory]))
	if _, err := p.cache.SetNode(small.Annotations[gpu.AnnotationInventory], inv); err != nil {
		t.Fatal(err)
	}
	pod := gpuPod(t, "two", "", 0)
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceGPU] = resource.MustParse("2")
	pod.Spec.Containers[0].Resources.Requests[gpu.ResourceGPU] = resource.MustParse("2")
	ctx := context.Background()
	if _, st := p.PreFilter(ctx, framework.NewCycleState(), pod, []fwk.NodeInfo{snapshotOf(small)}); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PreFilter = %v", st)
	}
	if len(p.waiting.pods) != 0 {
		t.Fatal("a pod refused on a cache that was not behind waits for the cache")
	}
	larger := inventoryNode(t, testInventory("n1", 2, 81920, false))
	if _, st := p.PreFilter(ctx, framework.NewCycleState(), pod, []fwk.NodeInfo{snapshotOf(larger)}); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PreFilter = %v", st)
	}
	if len(p.waiting.pods) != 1 {
		t.Fatal("a pod refused on a cache behind the snapshot does not wait for the cache")
	}
	p.onNode(klog.Background(), larger)
	if got := q.take(); !slices.Equal(got, []string{"ml/two"}) {
		t.Fatalf("after the handler applied the inventory, activated %v", got)
	}
}

// TestNarrowsSearch: candidates are handed over only where the framework's
// count of nodes to find does not grow.
func TestNarrowsSearch(t *testing.T) {
	hundred := int32(100)
	for _, c := range []struct {
		candidates, all int
		percentage      *int32
		want            bool
	}{
		{500, 1000, nil, true},       // 230 to find instead of 420
		{2500, 5000, nil, false},     // 750 instead of 500
		{1000, 5000, nil, true},      // 420 instead of 500
		{250, 5000, nil, true},       // 120 instead of 500
		{50, 80, nil, true},          // under 100: all of them either way
		{2500, 5000, &hundred, true}, // every node scored: fewer is less
	} {
		if got := narrowsSearch(c.candidates, c.all, c.percentage); got != c.want {
			t.Errorf("narrowsSearch(%d of %d, %v) = %v, want %v", c.candidates, c.all, c.percentage, got, c.want)
		}
	}
}
