package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/cache"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// TestPendingMessageOnAThousandNodes: a GPU pod that fits none of 1,000
// nodes gets a status message — the framework's count of Filter's messages
// plus PostFilter's cluster-wide line — under 1 KiB that names the largest
// free fragment anywhere. With a node's numbers in Filter's message, it was
// one clause per node.
func TestPendingMessageOnAThousandNodes(t *testing.T) {
	registerMetrics()
	cfg := config.Default().Allocator
	cfg.MemoryOversubscription = 1
	base, err := allocator.New(&cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &Plugin{cfg: &cfg, shared: &shared{cache: cache.New(cfg.MemoryOversubscription), workload: newWorkloadTracker(base, cfg.WorkloadCoverage)}}
	p.synced.Store(true)
	const nodes, gpus = 1000, 8
	// Every GPU is partly taken by a time-sliced slice, leaving a fragment
	// that varies; one node in ten has only unhealthy GPUs. The largest
	// fragment is on one GPU only.
	largestNode, largestGPU := "gpu-node-0613", 5
	statuses := framework.NewDefaultNodeToStatus()
	var infos []fwk.NodeInfo
	for i := range nodes {
		name := fmt.Sprintf("gpu-node-%04d", i)
		inv := schedtest.Inventory(name, gpus, 81920, false)
		for g := range inv.GPUs {
			inv.GPUs[g].Healthy = i%10 != 7
		}
		if _, err := p.cache.SetNode(name, inv); err != nil {
			t.Fatal(err)
		}
		for g := range gpus {
			free, freeCores := int64(1024*((i+g)%30)), 10*((i*3+g)%60)
			if name == largestNode && g == largestGPU {
				free, freeCores = 36864, 700
			}
			uid := types.UID(fmt.Sprintf("%s-%d", name, g))
			if err := p.cache.AddBound(uid, string(uid), schedtest.Grant(name, g, 81920-free, 1000-freeCores, gpu.ModeTimeSlicing)); err != nil {
				t.Fatal(err)
			}
		}
		n := framework.NewNodeInfo()
		n.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{Allocatable: v1.ResourceList{gpu.ResourceGPU: resource.MustParse("64")}}})
		infos = append(infos, n)
	}
	never := v1.PreemptNever
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "ml", UID: "big", Annotations: map[string]string{gpu.AnnotationSharing: string(gpu.ModeTimeSlicing)}},
		Spec: v1.PodSpec{PreemptionPolicy: &never, Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
			gpu.ResourceGPU: resource.MustParse("1"), gpu.ResourceMemory: resource.MustParse("40960"), gpu.ResourceCores: resource.MustParse("50")}}}}}}
	ctx := context.Background()
	state := framework.NewCycleState()
	res, st := p.PreFilter(ctx, state, pod, infos)
	if !st.IsSuccess() {
		t.Fatalf("PreFilter: %v", st)
	}
	// As the framework does: the nodes PreFilter left out get one status,
	// the others are filtered.
	if res.AllNodes() || res.NodeNames.Len() != 900 {
		t.Fatalf("PreFilter's candidates: %v, want the 900 nodes with healthy GPUs", res)
	}
	statuses.SetAbsentNodesStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node(s) didn't satisfy plugin(s) [TesseraGPU]"))
	for _, n := range infos {
		if !res.NodeNames.Has(n.Node().Name) {
			continue
		}
		st := p.Filter(ctx, state, pod, n)
		if st.IsSuccess() {
			t.Fatalf("the pod fits %s", n.Node().Name)
		}
		statuses.Set(n.Node().Name, st)
	}
	_, st = p.PostFilter(ctx, state, pod, statuses)
	if st.Code() != fwk.Unschedulable {
		t.Fatalf("PostFilter: %v", st)
	}
	fitErr := &framework.FitError{Pod: pod, NumAllNodes: nodes, Diagnosis: framework.Diagnosis{NodeToStatus: statuses, PostFilterMsg: st.Message()}}
	msg := fitErr.Error()
	t.Logf("%d bytes: %s", len(msg), msg)
	if len(msg) >= 1024 {
		t.Errorf("message of %d bytes, want under 1 KiB", len(msg))
	}
	for _, want := range []string{
		"0/1000 nodes are available: 100 node(s) didn't satisfy plugin(s) [TesseraGPU], 900 no GPU with the memory and cores asked free.",
		fmt.Sprintf("largest free GPU fragment 36864 MiB and 70%% cores (node %s GPU %d)", largestNode, largestGPU),
		"nodes short of: 900 a GPU fragment, 100 healthy GPUs",
		"not preempting: the pod's preemptionPolicy is Never",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q", want)
		}
	}
}
