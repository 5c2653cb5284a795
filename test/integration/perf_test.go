package integration

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
)

// BenchmarkSchedulingThroughput is a scheduler_perf-style measurement on the
// in-process API server: 1,000 nodes × 8 GPUs, one tessera-scheduler process
// with both shipped profiles. In the same run it schedules
//   - baseline: pods of the upstream default profile asking for a plain
//     extended resource (example.com/gpu: 1), and
//   - tessera: the same number of TesseraGPU pods, a mix of whole GPUs,
//     MPS slices and time-sliced slices,
//
// in alternating rounds, and reports each one's pods/s (first pod created to
// last pod bound) and the p99 of the scheduler's own
// scheduling_attempt_duration_seconds for the profile. Run it with
//
//	make bench-scheduler
//
// It runs its rounds once whatever b.N is; use -benchtime 1x.
func BenchmarkSchedulingThroughput(b *testing.B) {
	const (
		nodes     = 1000
		gpusEach  = 8
		perRound  = 1000
		rounds    = 2
		baseline  = "default-scheduler"
		extraName = "example.com/gpu"
	)
	c := startCluster(b)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			addPerfNode(b, c, fmt.Sprintf("node-%04d", i), gpusEach, i%2 == 0, extraName)
		}()
	}
	wg.Wait()
	c.startScheduler("")
	results := map[string][]float64{}
	for r := range rounds {
		for _, profile := range []string{baseline, tesseraScheduler} {
			ns := c.namespace(fmt.Sprintf("perf-%s-%d", profile, r))
			pods := make([]*v1.Pod, perRound)
			for i := range perRound {
				pods[i] = perfPod(ns, fmt.Sprintf("p%04d", i), profile, i, extraName)
			}
			bound := c.watchBound(ns, perRound)
			start := time.Now()
			for i := range pods {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-sem; wg.Done() }()
					if _, err := c.client.CoreV1().Pods(ns).Create(c.ctx, pods[i], metav1.CreateOptions{}); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
			select {
			case <-bound:
			case <-time.After(time.Minute):
				b.Fatalf("round %d %s: not all %d pods bound after 1m; p0000: %q", r, profile, perRound, c.unschedulableMessage(ns, "p0000"))
			}
			rate := perRound / time.Since(start).Seconds()
			results[profile] = append(results[profile], rate)
			b.Logf("round %d %-18s %7.1f pods/s", r, profile, rate)
		}
	}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	base, ours := mean(results[baseline]), mean(results[tesseraScheduler])
	b.ReportMetric(base, "baseline-pods/s")
	b.ReportMetric(ours, "tessera-pods/s")
	b.ReportMetric(ours/base, "ratio")
	b.ReportMetric(attemptP99(b, baseline)*1000, "baseline-p99-ms")
	b.ReportMetric(attemptP99(b, tesseraScheduler)*1000, "tessera-p99-ms")
	b.ReportMetric(0, "ns/op") // one run, not per-op
	for _, profile := range []string{baseline, tesseraScheduler} {
		for _, result := range []string{"scheduled", "unschedulable", "error"} {
			b.Logf("%s attempts %s: %v", profile, result, gauge(b, "scheduler_schedule_attempts_total", map[string]string{"profile": profile, "result": result}))
		}
	}
}

// addPerfNode registers a node with gpus GPUs, advertised both as the plain
// extended resource for the baseline and as a Tessera inventory; every other
// node runs MPS.
// watchBound closes the returned channel once n pods of the namespace are
// bound. It watches (an informer, which re-establishes its watch) rather
// than lists: polling a list of a thousand pods would load the API server
// both sides share and skew the comparison.
func (c *cluster) watchBound(ns string, n int) <-chan struct{} {
	done := make(chan struct{})
	factory := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithNamespace(ns))
	var (
		mu    sync.Mutex
		bound = map[string]bool{}
	)
	note := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !bound[p.Name] {
			bound[p.Name] = true
			if len(bound) == n {
				close(done)
			}
		}
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    note,
		UpdateFunc: func(_, obj any) { note(obj) },
	}); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	c.t.Cleanup(cancel)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return done
}

func addPerfNode(b *testing.B, c *cluster, name string, gpus int, mps bool, extra string) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	node, err := c.client.CoreV1().Nodes().Create(c.ctx, node, metav1.CreateOptions{})
	if err != nil {
		b.Error(err)
		return
	}
	res := v1.ResourceList{v1.ResourceCPU: resource.MustParse("128"), v1.ResourceMemory: resource.MustParse("1Ti"),
		v1.ResourcePods: resource.MustParse("250"), v1.ResourceName(extra): *resource.NewQuantity(int64(gpus), resource.DecimalSI),
		gpu.ResourceGPU: *resource.NewQuantity(int64(8*gpus), resource.DecimalSI)} // the agent's slots, 8 per GPU
	node.Status = v1.NodeStatus{Capacity: res, Allocatable: res,
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, node, metav1.UpdateOptions{}); err != nil {
		b.Error(err)
		return
	}
	if err := inventory.Publish(c.ctx, c.client, nodeInventory(gpuNode{name: name, gpus: gpus, memMi: 81920, mps: mps})); err != nil {
		b.Error(err)
	}
}

// perfPod is pod i of a round: for the baseline one example.com/gpu; for
// Tessera a mix of a quarter whole GPUs, MPS slices and time-sliced slices.
func perfPod(ns, name, profile string, i int, extra string) *v1.Pod {
	if profile != tesseraScheduler {
		p := makePod(ns, podSpec{name: name})
		p.Spec.SchedulerName = profile
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceName(extra): resource.MustParse("1")}
		return p
	}
	switch i % 4 {
	case 0:
		return makePod(ns, podSpec{name: name, gpus: 1})
	case 1, 2:
		return makePod(ns, podSpec{name: name, gpus: 1, memMi: 10240, cores: 20, annotations: map[string]string{gpu.AnnotationSharing: "mps"}})
	default:
		return makePod(ns, podSpec{name: name, gpus: 1, memMi: 8192, cores: 15, annotations: map[string]string{gpu.AnnotationSharing: "time-slicing", gpu.AnnotationWorkload: "inference"}})
	}
}

// attemptP99 is the 99th percentile of scheduler_scheduling_attempt_duration_seconds
// for a profile's successful attempts, interpolated inside its bucket.
func attemptP99(b *testing.B, profile string) float64 {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "scheduler_scheduling_attempt_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["profile"] != profile || labels["result"] != "scheduled" {
				continue
			}
			h := m.GetHistogram()
			total := float64(h.GetSampleCount())
			target := 0.99 * total
			bks := h.GetBucket()
			sort.Slice(bks, func(i, j int) bool { return bks[i].GetUpperBound() < bks[j].GetUpperBound() })
			lower, below := 0.0, 0.0
			for _, bk := range bks {
				n := float64(bk.GetCumulativeCount())
				if n >= target {
					if n == below {
						return bk.GetUpperBound()
					}
					return lower + (bk.GetUpperBound()-lower)*(target-below)/(n-below)
				}
				lower, below = bk.GetUpperBound(), n
			}
			return math.Inf(1)
		}
	}
	b.Fatalf("no scheduling attempts recorded for profile %s", profile)
	return 0
}
