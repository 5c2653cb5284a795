package scheduler

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/metrics"
)

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
