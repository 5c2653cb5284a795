package scheduler

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/metrics"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// harness is the plugin built by its factory on a framework handle over a
// fake API server holding the given nodes and pods, with its informers
// synced: what kube-scheduler gives it, less the scheduling loop, so each
// extension point can be called directly.
type harness struct {
	t      *testing.T
	ctx    context.Context
	p      *Plugin
	client *fake.Clientset
	nodes  map[string]*v1.Node
	pods   []*v1.Pod
	queue  *fakeQueue

	mu       sync.Mutex
	bindings []*v1.Binding
}

func newHarness(t *testing.T, args string, nodes []*v1.Node, pods ...*v1.Pod) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var objs []runtime.Object
	h := &harness{t: t, ctx: ctx, nodes: map[string]*v1.Node{}, pods: pods, queue: &fakeQueue{}}
	for _, n := range nodes {
		objs = append(objs, n)
		h.nodes[n.Name] = n
	}
	for _, p := range pods {
		objs = append(objs, p)
	}
	h.client = fake.NewClientset(objs...)
	h.client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := a.(clienttesting.CreateAction).GetObject().(*v1.Binding)
		if b.Target.Name == "refuses-bindings" {
			return true, nil, errors.New("the API server is unavailable")
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		h.bindings = append(h.bindings, b)
		return true, b, nil
	})
	factory := informers.NewSharedInformerFactory(h.client, 0)
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil,
		frameworkruntime.WithClientSet(h.client), frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithEventRecorder(events.NewFakeRecorder(100)), frameworkruntime.WithPodActivator(h.queue))
	if err != nil {
		t.Fatal(err)
	}
	var obj runtime.Object
	if args != "" {
		obj = &runtime.Unknown{Raw: []byte(args)}
	}
	pl, err := pluginFactory(nil)(ctx, obj, fh)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	h.p = pl.(*Plugin)
	if err := h.p.waitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// nodeInfo is the scheduler's snapshot of a node: the node and its pods.
func (h *harness) nodeInfo(name string) fwk.NodeInfo {
	var on []*v1.Pod
	for _, p := range h.pods {
		if p.Spec.NodeName == name {
			on = append(on, p)
		}
	}
	return schedtest.SnapshotOf(h.nodes[name], on...)
}

// preFilter runs PreFilter into a fresh cycle state.
func (h *harness) preFilter(pod *v1.Pod) (fwk.CycleState, *fwk.Status) {
	state := framework.NewCycleState()
	_, st := h.p.PreFilter(h.ctx, state, pod, nil)
	return state, st
}

// wholeGPUPod is a pending pod asking for n whole GPUs.
func wholeGPUPod(name string, n string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID("uid-" + fakeUID(name))},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "m", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{gpu.ResourceGPU: resource.MustParse(n)}, Requests: v1.ResourceList{gpu.ResourceGPU: resource.MustParse(n)}}}}}}
}

func fakeUID(s string) string { return strings.ReplaceAll(s, "/", "-") }

// oneGPUNodes are a node whose GPU a bound pod holds, a free node, a node
// without an inventory, one whose inventory is garbage, and one whose
// device-plugin slots are gone.
func oneGPUNodes(t *testing.T) ([]*v1.Node, []*v1.Pod) {
	full := schedtest.InventoryNode(t, schedtest.Inventory("full", 1, 81920, false))
	free := schedtest.InventoryNode(t, schedtest.Inventory("free", 1, 81920, false))
	bare := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	garbage := schedtest.InventoryNode(t, schedtest.Inventory("garbage", 1, 81920, false))
	garbage.Annotations[gpu.AnnotationInventory] = `{"v":"v1","gpus":[`
	noSlots := schedtest.InventoryNode(t, schedtest.Inventory("no-slots", 1, 81920, false))
	noSlots.Status.Allocatable[gpu.ResourceGPU] = resource.MustParse("0")
	sick := schedtest.Inventory("unhealthy", 1, 81920, false)
	sick.GPUs[0].Healthy = false
	return []*v1.Node{full, free, bare, garbage, noSlots, schedtest.InventoryNode(t, sick)}, []*v1.Pod{schedtest.GPUPod(t, "holder", "full", 0)}
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
		code  fwk.Code
		msg   string
		slots int64
	}{
		{"no GPUs: skipped", web, fwk.Skip, "", 0},
		{"one whole GPU", wholeGPUPod("one", "1"), fwk.Success, "", 1},
		{"more GPUs than any node has", wholeGPUPod("two", "2"), fwk.UnschedulableAndUnresolvable, "asks for 2 GPUs on one node, but the node with the most GPUs has 1", 0},
		{"cores out of range", cores, fwk.UnschedulableAndUnresolvable, "must be 1–100", 0},
		{"larger than every GPU", huge, fwk.UnschedulableAndUnresolvable, "largest GPU in the cluster has 81920 MiB", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			state, st := h.preFilter(c.pod)
			if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
				t.Fatalf("PreFilter = %v %q, want %v containing %q", st.Code(), st.Message(), c.code, c.msg)
			}
			s := readState(state)
			if c.code != fwk.Success {
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

func TestFilter(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	h := newHarness(t, "", nodes, pods...)
	pod := wholeGPUPod("one", "1")
	state, st := h.preFilter(pod)
	if !st.IsSuccess() {
		t.Fatal(st)
	}
	for _, c := range []struct {
		node string
		code fwk.Code
		msg  string
	}{
		{"free", fwk.Success, ""},
		{"full", fwk.Unschedulable, allocator.NotEnoughWholeGPUs.Message()},
		{"bare", fwk.UnschedulableAndUnresolvable, "is tessera-agent running there?"},
		{"garbage", fwk.UnschedulableAndUnresolvable, "is unreadable (see the node's InvalidGPUInventory event)"},
		{"no-slots", fwk.Unschedulable, reasonInsufficientSlots},
		// The node's GPUs alone refuse it: no eviction helps, so
		// preemption passes the node by.
		{"unhealthy", fwk.UnschedulableAndUnresolvable, allocator.NoHealthyGPU.Message()},
	} {
		t.Run(c.node, func(t *testing.T) {
			st := h.p.Filter(h.ctx, state, pod, h.nodeInfo(c.node))
			if st.Code() != c.code || st.Message() != c.msg && !strings.Contains(st.Message(), c.msg) {
				t.Fatalf("Filter on %s = %v %q, want %v %q", c.node, st.Code(), st.Message(), c.code, c.msg)
			}
		})
	}
	// The cluster-wide tally PostFilter reports.
	if got := readState(state).rejected.dominant(); got == "Other" {
		t.Fatalf("no reason tallied")
	}
	// A cycle without PreFilter's state is a bug to report, not a fit.
	st = h.p.Filter(h.ctx, framework.NewCycleState(), pod, h.nodeInfo("free"))
	if st.Code() != fwk.Error || !errors.Is(st.AsError(), errNoCycleState) {
		t.Fatalf("Filter without PreFilter's state = %v %q, want an Error naming the missing state", st.Code(), st.Message())
	}
}

// TestSlotsFit: kubelet's device-plugin slots decide as the snapshot counts
// them, whether the allocatable comes from the snapshot's map or from the
// cache's read of the same object (FitNode).
func TestSlotsFit(t *testing.T) {
	node := schedtest.InventoryNode(t, schedtest.Inventory("n1", 1, 81920, false)) // 8 slots
	taken := wholeGPUPod("taken", "1")
	taken.Spec.Containers[0].Resources.Requests = v1.ResourceList{gpu.ResourceGPU: resource.MustParse("7")}
	info := schedtest.SnapshotOf(node, taken)
	for _, c := range []struct {
		name              string
		want, allocatable int64
		fits              bool
	}{
		{"one of one free, from the snapshot", 1, -1, true},
		{"two of one free, from the snapshot", 2, -1, false},
		{"one of one free, from the cache", 1, 8, true},
		{"two of one free, from the cache", 2, 8, false},
		{"none asked", 0, 0, true},
	} {
		if st := slotsFit(c.want, info, c.allocatable); st.IsSuccess() != c.fits {
			t.Errorf("%s: slotsFit = %v, want fits %v", c.name, st, c.fits)
		}
	}
}

func TestScore(t *testing.T) {
	busy := schedtest.InventoryNode(t, schedtest.Inventory("busy", 2, 81920, false))
	idle := schedtest.InventoryNode(t, schedtest.Inventory("idle", 2, 81920, false))
	for _, c := range []struct {
		policy, want string
	}{
		{"binpack", "busy"},
		{"spread", "idle"},
	} {
		t.Run(c.policy, func(t *testing.T) {
			h := newHarness(t, `{"policy":"`+c.policy+`"}`, []*v1.Node{busy, idle}, schedtest.GPUPod(t, "holder", "busy", 0))
			pod := wholeGPUPod("one", "1")
			state, st := h.preFilter(pod)
			if !st.IsSuccess() {
				t.Fatal(st)
			}
			if st := h.p.PreScore(h.ctx, state, pod, nil); !st.IsSuccess() {
				t.Fatal(st)
			}
			var scores fwk.NodeScoreList
			for _, n := range []string{"busy", "idle"} {
				s, st := h.p.Score(h.ctx, state, pod, h.nodeInfo(n))
				if !st.IsSuccess() {
					t.Fatal(st)
				}
				scores = append(scores, fwk.NodeScore{Name: n, Score: s})
			}
			if st := h.p.NormalizeScore(h.ctx, state, pod, scores); !st.IsSuccess() {
				t.Fatal(st)
			}
			best := scores[0]
			for _, s := range scores {
				if s.Score < 0 || s.Score > fwk.MaxNodeScore {
					t.Fatalf("normalized score %d outside 0–%d", s.Score, fwk.MaxNodeScore)
				}
				if s.Score > best.Score {
					best = s
				}
			}
			if best.Name != c.want || best.Score != fwk.MaxNodeScore {
				t.Fatalf("%s scores %v, want %s first at %d", c.policy, scores, c.want, fwk.MaxNodeScore)
			}
		})
	}
	t.Run("pod without GPUs", func(t *testing.T) {
		h := newHarness(t, "", []*v1.Node{busy})
		if st := h.p.PreScore(h.ctx, framework.NewCycleState(), &v1.Pod{}, nil); st.Code() != fwk.Skip {
			t.Fatalf("PreScore = %v, want Skip", st)
		}
	})
}

func TestReserveAndUnreserve(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	h := newHarness(t, "", nodes, pods...)
	first, second := wholeGPUPod("first", "1"), wholeGPUPod("second", "1")
	s1, _ := h.preFilter(first)
	s2, _ := h.preFilter(second)
	if st := h.p.Reserve(h.ctx, s1, first, "free"); !st.IsSuccess() {
		t.Fatalf("Reserve = %v", st)
	}
	if a := h.p.cache.Assignment(first.UID); a == nil || a.Node != "free" || readState(s1).assignment != a {
		t.Fatalf("booked %+v, want the assignment on node free in the cycle state", a)
	}
	if st := h.p.Reserve(h.ctx, s2, second, "free"); st.Code() != fwk.Unschedulable || st.Message() != "" && !strings.Contains(st.Message(), "whole") {
		t.Fatalf("second Reserve on the same GPU = %v %q, want Unschedulable", st.Code(), st.Message())
	}
	if st := h.p.Reserve(h.ctx, s2, second, "bare"); st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), "lost its GPU inventory") {
		t.Fatalf("Reserve on a node without inventory = %v %q", st.Code(), st.Message())
	}
	freed := h.p.cache.RoomChanges()
	h.p.Unreserve(h.ctx, s1, first, "free")
	if h.p.cache.Assignment(first.UID) != nil || readState(s1).assignment != nil || h.p.cache.RoomChanges() == freed {
		t.Fatal("Unreserve kept the booking")
	}
	if st := h.p.Reserve(h.ctx, s2, second, "free"); !st.IsSuccess() {
		t.Fatalf("Reserve after the release = %v", st)
	}
}

func TestBind(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	refuses := schedtest.InventoryNode(t, schedtest.Inventory("refuses-bindings", 1, 81920, false))
	h := newHarness(t, "", append(nodes, refuses), pods...)
	pod := wholeGPUPod("one", "1")
	state, _ := h.preFilter(pod)
	if st := h.p.Reserve(h.ctx, state, pod, "free"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.p.Bind(h.ctx, state, pod, "free"); !st.IsSuccess() {
		t.Fatalf("Bind = %v", st)
	}
	h.mu.Lock()
	if len(h.bindings) != 1 {
		t.Fatalf("%d bindings", len(h.bindings))
	}
	b := h.bindings[0]
	h.mu.Unlock()
	a, err := gpu.DecodeAssignment(b.Annotations[gpu.AnnotationAssignment])
	if err != nil || b.Target.Name != "free" || b.Name != "one" || a.Node != "free" || a.Containers[0].GPUs[0].UUID != "GPU-free-0" {
		t.Fatalf("binding %+v (assignment %+v, %v): want pod one to node free with its GPU", b, a, err)
	}

	other := wholeGPUPod("other", "1")
	s2, _ := h.preFilter(other)
	if st := h.p.Reserve(h.ctx, s2, other, "refuses-bindings"); !st.IsSuccess() {
		t.Fatal(st)
	}
	if st := h.p.Bind(h.ctx, s2, other, "refuses-bindings"); st.IsSuccess() || !strings.Contains(st.Message(), "bind pod ml/other to refuses-bindings") {
		t.Fatalf("Bind against a failing API server = %v", st)
	}
	if st := h.p.Bind(h.ctx, framework.NewCycleState(), &v1.Pod{}, "free"); st.Code() != fwk.Skip {
		t.Fatalf("Bind of a pod without GPUs = %v, want Skip", st)
	}
}

func TestPostFilterNotifiesTheVictim(t *testing.T) {
	node := schedtest.InventoryNode(t, schedtest.Inventory("n1", 1, 81920, false))
	low := schedtest.GPUPod(t, "low", "n1", 0)
	lowPrio, highPrio := int32(10), int32(1000)
	low.Spec.Priority = &lowPrio
	low.Spec.PreemptionPolicy = nil
	low.ResourceVersion = "1"
	h := newHarness(t, "", []*v1.Node{node}, low)
	urgent := wholeGPUPod("urgent", "1")
	urgent.Spec.Priority = &highPrio
	state, _ := h.preFilter(urgent)
	statuses := framework.NewDefaultNodeToStatus()
	statuses.Set("n1", h.p.Filter(h.ctx, state, urgent, h.nodeInfo("n1")))
	if st := statuses.Get("n1"); st.Code() != fwk.Unschedulable {
		t.Fatalf("Filter = %v", st)
	}
	statuses.Get("n1").SetPlugin(Name)
	res, st := h.p.PostFilter(h.ctx, state, urgent, statuses)
	if !st.IsSuccess() || res == nil || res.NominatedNodeName != "n1" {
		t.Fatalf("PostFilter = %+v, %v; want the pod nominated to n1", res, st)
	}
	got, err := h.client.CoreV1().Pods("ml").Get(h.ctx, "low", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := preemption.NoticeOf(got)
	if err != nil || n == nil || n.PreemptorUID != string(urgent.UID) || n.Node != "n1" || n.Deadline.Sub(n.NoticeAt) != 30*time.Second {
		t.Fatalf("victim's notice %+v, %v", n, err)
	}
}

// TestPendingCollectorSumsLiveInstances: each plugin instance keeps its
// own pending pods; the one collector sums the instances alive and drops
// one whose scheduler stopped.
func TestPendingCollectorSumsLiveInstances(t *testing.T) {
	nodes, pods := oneGPUNodes(t)
	waiting := []*v1.Pod{wholeGPUPod("a", "2"), wholeGPUPod("b", "2"), wholeGPUPod("c", "1")}
	h1 := newHarness(t, "", nodes, append(pods, waiting...)...)
	h2 := newHarness(t, "", nodes, append(pods, waiting...)...)
	h1.p.pending.set(waiting[0], "NotEnoughWholeGPUs")
	h2.p.pending.set(waiting[1], "NotEnoughWholeGPUs")
	h2.p.pending.set(waiting[2], "NoHealthyGPU")
	c := &pendingCollector{}
	c.track(h1.ctx, &h1.p.pending, h1.p.pods)
	ctx2, stop2 := context.WithCancel(h2.ctx)
	c.track(ctx2, &h2.p.pending, h2.p.pods)
	if got, want := pendingPods(t, c), map[string]float64{"NoHealthyGPU": 1, "NotEnoughWholeGPUs": 2}; !maps.Equal(got, want) {
		t.Fatalf("pending GPU pods %v, want %v", got, want)
	}
	stop2()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return maps.Equal(pendingPods(t, c), map[string]float64{"NotEnoughWholeGPUs": 1}), nil
	})
	if err != nil {
		t.Fatalf("the stopped instance's pending pods are still exported: %v", pendingPods(t, c))
	}
}

// pendingPods is tessera_scheduler_pending_gpu_pods as c exports it, by
// reason.
func pendingPods(t *testing.T, c *pendingCollector) map[string]float64 {
	t.Helper()
	ch := make(chan metrics.Metric, 100)
	c.CollectWithStability(ch)
	close(ch)
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(m.Desc().String(), `"tessera_scheduler_pending_gpu_pods"`) {
			continue
		}
		out[d.GetLabel()[0].GetValue()] = d.GetGauge().GetValue()
	}
	return out
}
