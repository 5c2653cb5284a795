package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/scheduler/schedtest"
)

// BenchmarkFilterPerNode is what the plugin adds to each node the framework
// visits for a GPU pod, on 5,000 nodes × 8 GPUs (every other node with
// MPS-capable GPUs, each GPU a quarter used), for an MPS slice: Filter on
// every node (the half whose GPUs cannot run MPS refused), and Score on the
// nodes that fit. The framework's own per-node cost (its plugin loop,
// statuses, nominated pods) is not counted. Reported: filter-ns/node and
// score-ns/node.
func BenchmarkFilterPerNode(b *testing.B) {
	const nodes, gpus = 5000, 8
	p := hintPlugin(b, &fakeQueue{})
	alloc := schedtest.NewAllocator(b)
	infos := make([]fwk.NodeInfo, nodes)
	for i := range nodes {
		name := fmt.Sprintf("gpu-node-%04d", i)
		mps := i%2 == 0
		inv := schedtest.Inventory(name, gpus, 81920, mps)
		node := schedtest.InventoryNode(b, inv)
		if _, err := p.cache.SetNodeFrom(node, inv); err != nil {
			b.Fatal(err)
		}
		mode := gpu.ModeTimeSlicing
		if mps {
			mode = gpu.ModeMPS
		}
		for g := range gpus {
			uid := types.UID(fmt.Sprintf("%s-%d", name, g))
			if _, reason, err := p.cache.Reserve(alloc, uid, string(uid), name, schedtest.SliceOf(mode, 20480, 25)); err != nil || !reason.OK() {
				b.Fatal(reason, err)
			}
		}
		infos[i] = schedtest.SnapshotOf(node)
	}
	pod := schedtest.GPUPod(b, "slice", "", 0)
	pod.Annotations[gpu.AnnotationSharing] = string(gpu.ModeMPS)
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceMemory] = resource.MustParse("10240")
	pod.Spec.Containers[0].Resources.Limits[gpu.ResourceCores] = resource.MustParse("20")
	ctx := context.Background()
	var filter, score time.Duration
	var filtered, scored int
	for b.Loop() {
		state := framework.NewCycleState()
		if _, st := p.PreFilter(ctx, state, pod, infos); !st.IsSuccess() {
			b.Fatal(st)
		}
		fits := make([]fwk.NodeInfo, 0, nodes/2)
		start := time.Now()
		for _, n := range infos {
			if p.Filter(ctx, state, pod, n).IsSuccess() {
				fits = append(fits, n)
			}
		}
		mid := time.Now()
		for _, n := range fits {
			if _, st := p.Score(ctx, state, pod, n); !st.IsSuccess() {
				b.Fatal(st)
			}
		}
		filter += mid.Sub(start)
		score += time.Since(mid)
		filtered += len(infos)
		scored += len(fits)
	}
	if scored == 0 {
		b.Fatal("the slice fitted no node")
	}
	b.ReportMetric(float64(filter.Nanoseconds())/float64(filtered), "filter-ns/node")
	b.ReportMetric(float64(score.Nanoseconds())/float64(scored), "score-ns/node")
}
