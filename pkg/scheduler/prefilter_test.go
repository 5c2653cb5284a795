package scheduler

import (
	"context"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// TestPreFilterNamesCandidates: PreFilter restricts the cycle to the
// candidates, except when the scheduler's snapshot has nodes the cache has
// not seen; when no node fits, PostFilter counts the nodes left out and
// marks the cycle behind where the snapshot shows an inventory the cache
// has not applied.
func TestPreFilterNamesCandidates(t *testing.T) {
	p := hintPlugin(t, &fakeQueue{})
	mpsNode, tsNode := schedtest.InventoryNode(t, schedtest.Inventory("mps", 1, 81920, true)), schedtest.InventoryNode(t, schedtest.Inventory("ts", 1, 81920, false))
	for _, n := range []*v1.Node{mpsNode, tsNode} {
		inv, _ := gpu.DecodeInventory([]byte(n.Annotations[gpu.AnnotationInventory]))
		if _, err := p.cache.SetNode(n.Annotations[gpu.AnnotationInventory], inv); err != nil {
			t.Fatal(err)
		}
	}
	// Node mps's one GPU is taken whole: the MPS slice fits nowhere.
	if _, reason, err := p.cache.Reserve(schedtest.NewAllocator(t), "holder", "ml/holder", "mps", schedtest.WholeGPUs(1)); err != nil || !reason.OK() {
		t.Fatal(reason, err)
	}
	pod := schedtest.GPUPod(t, "slice", "", 0)
	pod.Annotations[gpu.AnnotationSharing] = string(gpu.ModeMPS)
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceMemory] = resource.MustParse("10240")
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceCores] = resource.MustParse("20")
	ctx := context.Background()
	infos := []fwk.NodeInfo{schedtest.SnapshotOf(mpsNode, schedtest.GPUPod(t, "holder", "mps", 0)), schedtest.SnapshotOf(tsNode)}

	state := framework.NewCycleState()
	res, st := p.PreFilter(ctx, state, pod, infos)
	if !st.IsSuccess() || res == nil || !res.NodeNames.Equal(sets.New("mps")) {
		t.Fatalf("PreFilter = %v, %v; want only node mps", res, st)
	}
	if res, _ := p.PreFilter(ctx, framework.NewCycleState(), pod, append(infos, schedtest.SnapshotOf(schedtest.InventoryNode(t, schedtest.Inventory("new", 1, 81920, false))))); res != nil {
		t.Fatalf("with a node the cache has not seen, PreFilter restricted the cycle to %v", res.NodeNames)
	}

	// The scheduler's snapshot already shows node ts with MPS GPUs; the
	// cache has not applied it.
	tsNow := schedtest.InventoryNode(t, schedtest.Inventory("ts", 1, 81920, true))
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
	small := schedtest.InventoryNode(t, schedtest.Inventory("n1", 1, 81920, false))
	inv, _ := gpu.DecodeInventory([]byte(small.Annotations[gpu.AnnotationInventory]))
	if _, err := p.cache.SetNode(small.Annotations[gpu.AnnotationInventory], inv); err != nil {
		t.Fatal(err)
	}
	pod := schedtest.GPUPod(t, "two", "", 0)
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceGPU] = resource.MustParse("2")
	pod.Spec.Containers[0].Resources.Requests[gpu.ResourceGPU] = resource.MustParse("2")
	ctx := context.Background()
	if _, st := p.PreFilter(ctx, framework.NewCycleState(), pod, []fwk.NodeInfo{schedtest.SnapshotOf(small)}); st.Code() != fwk.UnschedulableAndUnresolvable {
		t.Fatalf("PreFilter = %v", st)
	}
	if len(p.waiting.pods) != 0 {
		t.Fatal("a pod refused on a cache that was not behind waits for the cache")
	}
	larger := schedtest.InventoryNode(t, schedtest.Inventory("n1", 2, 81920, false))
	if _, st := p.PreFilter(ctx, framework.NewCycleState(), pod, []fwk.NodeInfo{schedtest.SnapshotOf(larger)}); st.Code() != fwk.UnschedulableAndUnresolvable {
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

func TestPreFilter(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	h := newHarness(t, "", nodes, pods...)
	cores := wholeGPUPod("cores", "1")
	cores.Spec.Containers[0].Resources.Limits[gpu.ResourceCores] = resource.MustParse("150")
	cores.Spec.Containers[0].Resources.Limits[gpu.ResourceMemory] = resource.MustParse("8192")
	huge := wholeGPUPod("huge", "1")
	huge.Spec.Containers[0].Resources.Limits[gpu.ResourceMemory] = resource.MustParse("200000")
	huge.Spec.Containers[0].Resources.Limits[gpu.ResourceCores] = resource.MustParse("10")
	web := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "web"}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c"}}}}
	for _, c := range []struct {
		name  string
		pod   *v1.Pod
		want  *fwk.Status
		slots int64
	}{
		{"no GPUs: skipped", web, fwk.NewStatus(fwk.Skip), 0},
		{"one whole GPU", wholeGPUPod("one", "1"), nil, 1},
		{"more GPUs than any node has", wholeGPUPod("two", "2"), fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
			"the pod asks for 2 GPUs on one node, but the node with the most GPUs has 1; it waits until a node with more joins (or ask for fewer)"), 0},
		{"cores out of range", cores, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, invalidRequest(t, h, cores, "must be 1–100")), 0},
		{"larger than every GPU", huge, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, invalidRequest(t, h, huge, "largest GPU in the cluster has 81920 MiB")), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			state, st := h.preFilter(c.pod)
			if d := cmp.Diff(c.want, st); d != "" {
				t.Fatalf("PreFilter (-want +got):\n%s", d)
			}
			s := readState(state)
			if !st.IsSuccess() {
				if s != nil {
					t.Fatal("a refused pod left cycle state")
				}
				return
			}
			if s == nil || s.req == nil || s.slots != c.slots || s.freedAt != h.p.cache.RoomChanges() {
				t.Fatalf("cycle state %+v, want the request and %d slots", s, c.slots)
			}
		})
	}
}

// invalidRequest is the message PreFilter gives a pod whose request the
// plugin refuses as invalid, checked to say what is wrong (says).
func invalidRequest(t *testing.T, h *harness, pod *v1.Pod, says string) string {
	t.Helper()
	_, err := h.p.request(pod)
	if err == nil || !strings.Contains(err.Error(), says) {
		t.Fatalf("pod %s: request error %v, want one saying %q", pod.Name, err, says)
	}
	return err.Error()
}
