package scheduler

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	"github.com/tessera-gpu/tessera/pkg/gpu"
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
	pl, err := pluginFactory(nil, nil)(ctx, obj, fh)
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
