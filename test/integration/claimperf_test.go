package integration

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/inventory"
)

// BenchmarkClaimSchedulingThroughput measures pods asking with
// gpu.tessera.dev ResourceClaims on the in-process API server: one
// tessera-scheduler process with both shipped profiles, 100 DRA nodes × 8
// H100s (each with the ResourceSlice the agent's driver publishes and an
// inventory saying it serves DRA). In the same run it schedules
//   - baseline: claim pods of the default profile, whose upstream
//     DynamicResources allocates them first fit, and
//   - tessera: the same claim pods through the Tessera profile, where
//     TesseraGPU ranks each node's GPUs by the fragmentation gradient and
//     runs upstream's allocator over them in that order,
//
// in four rounds of 200 pods each after an unmeasured warm-up of 50 of
// each, alternating which goes first. Each pod has its own claim (created
// before the round's clock starts), a quarter asking 20Gi and 50 cores,
// the rest 10Gi and 25. It reports each one's pods/s (the median of its
// rounds, first pod created to last pod bound) and their ratio.
//
//	make bench-scheduler
func BenchmarkClaimSchedulingThroughput(b *testing.B) {
	const (
		nodes    = 100
		gpusEach = 8
		perRound = 200
		rounds   = 4
		warmUp   = 50
		baseline = "default-scheduler"
	)
	c := startCluster(b)
	c.createShippedDeviceClasses()
	inParallel(nodes, func(i int) { addDRAPerfNode(b, c, fmt.Sprintf("dra-%03d", i), gpusEach) })
	c.startScheduler("")
	round := func(name, profile string, n int) float64 {
		ns := c.namespace(name)
		pods := make([]*v1.Pod, n)
		claims := make([]*resourceapi.ResourceClaim, n)
		for i := range n {
			capacity := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "cores": resource.MustParse("25")}
			if i%4 == 0 {
				capacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("20Gi"), "cores": resource.MustParse("50")}
			}
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%04d", i), Namespace: ns},
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
					Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName, Capacity: &resourceapi.CapacityRequirements{Requests: capacity}}}}}}}
			claims[i] = claim
			pods[i] = &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%04d", i), Namespace: ns},
				Spec: v1.PodSpec{SchedulerName: profile, ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
					Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}}
		}
		inParallel(n, func(i int) {
			if _, err := c.client.ResourceV1().ResourceClaims(ns).Create(c.ctx, claims[i], metav1.CreateOptions{}); err != nil {
				b.Error(err)
			}
		})
		done := c.watchBound(ns, n)
		start := time.Now()
		inParallel(n, func(i int) {
			if _, err := c.client.CoreV1().Pods(ns).Create(c.ctx, pods[i], metav1.CreateOptions{}); err != nil {
				b.Error(err)
			}
		})
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			b.Fatalf("%s: not all %d claim pods bound after 2m; p0000: %q", name, n, c.unschedulableMessage(ns, "p0000"))
		}
		return float64(n) / time.Since(start).Seconds()
	}
	profiles := []string{baseline, tesseraScheduler}
	for _, profile := range profiles {
		round("claims-warmup-"+profile, profile, warmUp)
	}
	results := map[string][]float64{}
	for r := range rounds {
		order := profiles
		if r%2 == 1 {
			order = []string{profiles[1], profiles[0]}
		}
		for _, profile := range order {
			rate := round(fmt.Sprintf("claims-%s-%d", profile, r), profile, perRound)
			results[profile] = append(results[profile], rate)
			b.Logf("round %d %-18s %7.1f claim pods/s", r, profile, rate)
		}
	}
	base, ours := median(results[baseline]), median(results[tesseraScheduler])
	b.ReportMetric(base, "baseline-pods/s")
	b.ReportMetric(ours, "tessera-pods/s")
	b.ReportMetric(ours/base, "ratio")
	b.ReportMetric(0, "ns/op") // one run, not per-op
}

// addDRAPerfNode adds a Ready node of gpus H100s that serves DRA: its
// inventory says so, and the driver's ResourceSlice (dra.Resources, the
// chart's policy) is created as the agent publishes it.
func addDRAPerfNode(b *testing.B, c *cluster, name string, gpus int) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	node, err := c.client.CoreV1().Nodes().Create(c.ctx, node, metav1.CreateOptions{})
	if err != nil {
		b.Error(err)
		return
	}
	res := v1.ResourceList{v1.ResourceCPU: resource.MustParse("128"), v1.ResourceMemory: resource.MustParse("1Ti"), v1.ResourcePods: resource.MustParse("250")}
	node.Status = v1.NodeStatus{Capacity: res, Allocatable: res,
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, node, metav1.UpdateOptions{}); err != nil {
		b.Error(err)
		return
	}
	inv := nodeInventory(gpuNode{name: name, gpus: gpus, memMi: 81920})
	inv.DRA = true
	if _, err := inventory.Publish(c.ctx, c.client, inv); err != nil {
		b.Error(err)
		return
	}
	pool := dra.Resources(inv, dra.Policy{MinMemoryMiB: 4096, MemoryOversubscription: 1.5}, nil).Pools[name]
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + dra.DriverName},
		Spec: resourceapi.ResourceSliceSpec{Driver: dra.DriverName, NodeName: &name,
			Pool: resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1}, Devices: pool.Slices[0].Devices}}
	if _, err := c.client.ResourceV1().ResourceSlices().Create(c.ctx, slice, metav1.CreateOptions{}); err != nil {
		b.Error(err)
	}
}
