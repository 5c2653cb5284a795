package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/preemption"
	"github.com/tessera-gpu/tessera/pkg/top"
)

// TestDRANode: a playground with a DRA node beside a device-plugin node.
// The DRA node's agent publishes its ResourceSlice under its own
// (node-bound) identity; a pod asking with a ResourceClaim of the chart's
// DeviceClass is placed there by tessera-scheduler, its claim prepared by
// kubelet's DRA manager through the agent's driver (CDI spec and libtessera
// limits with exactly the capacity consumed), `tessera top` shows the
// claim on its GPU, and the pod's end unprepares it and (through
// kube-controller-manager's ResourceClaim controller) deallocates it; a
// pod asking through a ResourceClaimTemplate, as the user guide shows,
// runs with the claim the controller made for it.
func TestDRANode(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 2, GPUsPerNode: 2, Model: "h100", DRANodes: 1})
	dn := c.Nodes[1]
	if !dn.DRA || c.Nodes[0].DRA {
		t.Fatalf("DRA nodes: %v %v, want the last one only", c.Nodes[0].DRA, dn.DRA)
	}
	ctx := context.Background()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 1 && l.Items[0].Spec.NodeName != nil && *l.Items[0].Spec.NodeName == dn.Name &&
			len(l.Items[0].Spec.Devices) == 2, nil
	})
	if err != nil {
		t.Fatalf("no ResourceSlice of %s's two GPUs: %v", dn.Name, err)
	}

	const ns = "dra"
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "slice", Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName, Capacity: &resourceapi.CapacityRequirements{
				Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "cores": resource.MustParse("25")}}}}}}}}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: ns},
		Spec: v1.PodSpec{SchedulerName: "tessera-scheduler", ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			Containers: []v1.Container{{Name: "main", Image: "registry.example/infer", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim, err = c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	create(t, c.Client, pod)
	running := waitRunning(t, c.Client, ns, []string{"infer"}, time.Minute)["infer"]
	if running.Spec.NodeName != dn.Name {
		t.Fatalf("the claim's pod runs on %s, want the DRA node %s", running.Spec.NodeName, dn.Name)
	}

	specPath := dra.SpecPath(dn.CDIDir, claim.UID)
	b, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatalf("the claim's CDI spec: %v", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	env := strings.Join(spec.Devices[0].ContainerEdits.Env, " ") + " "
	// The playground's mock driver is R580's: libtessera holds the slice.
	for _, kv := range []string{"TESSERA_GPU_MEMORY_LIMIT_MIB=0=10240 ", "TESSERA_GPU_CORES_PERCENT=0=25 ", "TESSERA_GPU_ISOLATION=0:memory=shim,compute=shim "} {
		if !strings.Contains(env, kv) {
			t.Errorf("the claim's spec lacks %s: %s", kv, env)
		}
	}
	limits, err := os.ReadFile(filepath.Join(dn.ShimRoot, "claims", string(claim.UID), "limits"))
	if err != nil || !strings.Contains(string(limits), " 10737418240 25\n") {
		t.Errorf("the claim's libtessera limits: %q (%v)", limits, err)
	}

	snap, err := top.Collect(ctx, c.Client)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range snap.GPUs {
		for _, tn := range g.Tenants {
			if tn.Claim == "slice" && g.Node == dn.Name && tn.Pod == "infer" && tn.MemoryMiB == 10240 && tn.CoresPercent == 25 && tn.State == "Running" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("tessera top does not show the claim on %s: %+v", dn.Name, snap.GPUs)
	}

	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "infer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(specPath)
		return os.IsNotExist(err), nil
	}); err != nil {
		t.Errorf("the claim's CDI spec stayed after its pod ended: %v", err)
	}
	// kube-controller-manager's ResourceClaim controller (the playground
	// runs it) deallocates the claim once no pod holds it: the GPU's
	// capacity comes back.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
		return err == nil && got.Status.Allocation == nil && len(got.Status.ReservedFor) == 0, nil
	}); err != nil {
		t.Errorf("the claim stayed allocated after its pod ended: %v", err)
	}

	// The user guide's form: a ResourceClaimTemplate, one claim per pod,
	// made by the controller and deleted with its pod.
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu-slice", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: claim.Spec}}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmplName := tmpl.Name
	fromTemplate := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "templated", Namespace: ns},
		Spec: v1.PodSpec{SchedulerName: "tessera-scheduler", ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmplName}},
			Containers: []v1.Container{{Name: "main", Image: "registry.example/infer", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}}
	create(t, c.Client, fromTemplate)
	templated := waitRunning(t, c.Client, ns, []string{"templated"}, time.Minute)["templated"]
	if len(templated.Status.ResourceClaimStatuses) != 1 || templated.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("the templated pod's claim: %+v", templated.Status.ResourceClaimStatuses)
	}
	generated := *templated.Status.ResourceClaimStatuses[0].ResourceClaimName
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "templated", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Deallocated by the controller, and deleted (the playground deletes
	// a claim whose owning pod is gone, as a cluster's garbage collector does).
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, generated, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && got.Status.Allocation == nil), nil
	}); err != nil {
		t.Errorf("the templated pod's claim %s stayed allocated after the pod: %v", generated, err)
	}
}

// claimPod is a pod of tessera-scheduler at a priority class holding its
// own claim of the chart's gpu.tessera.dev class, which asks no capacity:
// a whole GPU.
func claimPod(t *testing.T, c *playground.Cluster, ns, name, class string, ann map[string]string) *v1.Pod {
	t.Helper()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName}}}}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.ResourceV1().ResourceClaims(ns).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return create(t, c.Client, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
		Spec: v1.PodSpec{SchedulerName: "tessera-scheduler", PriorityClassName: class, ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			Containers: []v1.Container{{Name: "main", Image: "registry.example/train", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}})
}

// TestDRAPreemption: a pod whose gpu.tessera.dev claim fits nowhere
// preempts a lower-priority claim holder, which upstream's scheduler
// cannot do in Kubernetes 1.37: the victim gets its notice, is stopped at
// its deadline, its claim is deallocated by the ResourceClaim controller,
// and the preemptor's claim is allocated that GPU and prepared — only
// once the agent has killed the process the victim left on the GPU (the
// last level), though the claim was free before.
func TestDRAPreemption(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 1, Model: "h100", DRANodes: 1})
	const ns = "drapreempt"
	node := c.Nodes[0]
	killedSeries := `tessera_reclaim_killed_processes_total{node="` + node.Name + `"}`
	refusedSeries := `tessera_dra_prepare_refusals_total{node="` + node.Name + `",reason="reclaiming"}`
	killedBefore := value(scrape(t, node.MetricsURL), killedSeries)
	claimPod(t, c, ns, "low", "gpu-standard", map[string]string{preemption.AnnotationGrace: "2s", playground.AnnotationLeftover: string(playground.LeftoverProcess)})
	low := waitRunning(t, c.Client, ns, []string{"low"}, time.Minute)["low"]
	if procs := processesOf(t, node, string(low.UID)); len(procs) != 1 {
		t.Fatalf("the victim's claim runs %v processes on the GPU, want 1", procs)
	}
	lowClaim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), "low", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The soft level: the claim's spec gives the pod its notice
	// directory, where the agent writes the notice.
	noticeDir := filepath.Join(filepath.Dir(c.Nodes[0].CDIDir), "preemption", string(low.UID))
	if b, err := os.ReadFile(dra.SpecPath(c.Nodes[0].CDIDir, lowClaim.UID)); err != nil || !strings.Contains(string(b), noticeDir) {
		t.Errorf("the victim's claim spec does not mount its notice directory %s: %v", noticeDir, err)
	}
	start := time.Now()
	claimPod(t, c, ns, "high", "gpu-critical", nil)
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(noticeDir, preemption.NoticeFile))
		return err == nil, nil
	}); err != nil {
		t.Errorf("the agent wrote no notice into the victim's notice directory: %v", err)
	}
	took := runningAfter(t, c.Client, ns, "high", start, time.Minute)
	t.Logf("claim preemption: preemptor Running %v after creation (victim's grace 2 s)", took.Round(time.Millisecond))
	// Its containers started after the victim's leftover was killed.
	if left := processesOf(t, node, string(low.UID)); len(left) > 0 {
		t.Errorf("the preemptor runs while the victim's processes %v still hold the GPU", left)
	}
	metrics := scrape(t, node.MetricsURL)
	if d := value(metrics, killedSeries) - killedBefore; d != 1 {
		t.Errorf("agent counted %v killed leftovers, want the victim's 1", d)
	}
	t.Logf("prepares of the preemptor's claim put off while the victim's GPU was reclaimed: %v", value(metrics, refusedSeries))
	if ev := events(t, c.Client, ns, "low"); !hasAll(ev, "PreemptionNotice") {
		t.Errorf("victim events %v; want its PreemptionNotice", ev)
	}
	if p := get(t, c.Client, ns, "low"); p != nil && p.DeletionTimestamp == nil {
		t.Errorf("the victim is still there: %s", p.Status.Phase)
	}
	got, err := c.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), "high", metav1.GetOptions{})
	if err != nil || got.Status.Allocation == nil || len(got.Status.Allocation.Devices.Results) != 1 || got.Status.Allocation.Devices.Results[0].Device != "gpu-0" {
		t.Fatalf("the preemptor's claim: %+v (%v); want it allocated gpu-0", got.Status.Allocation, err)
	}
	if _, err := os.Stat(dra.SpecPath(c.Nodes[0].CDIDir, got.UID)); err != nil {
		t.Errorf("the preemptor's claim was not prepared: %v", err)
	}
}

// TestKubeletRestartReleasesPodsDeletedMeanwhile: a claim pod deleted
// while its node's kubelet is down gets no event when the kubelet comes
// back; as kubelet's pod cleanup does, the restarted kubelet looks again at
// every pod it held, stops its processes and has its claim unprepared, so
// the agent removes the claim's CDI spec (the soak found one left at its
// end before).
func TestKubeletRestartReleasesPodsDeletedMeanwhile(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 1, Model: "h100", DRANodes: 1})
	const ns = "restart"
	claimPod(t, c, ns, "held", "gpu-standard", nil)
	pod := waitRunning(t, c.Client, ns, []string{"held"}, time.Minute)["held"]
	claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), "held", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := c.Nodes[0]
	spec := dra.SpecPath(node.CDIDir, claim.UID)
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the claim's CDI spec: %v", err)
	}
	zero := int64(0)
	if err := node.RestartKubeletAfter(func() error {
		// No kubelet to stop the containers: gone from the API at once.
		return c.Client.CoreV1().Pods(ns).Delete(context.Background(), "held", metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c.Client, ns, "held")
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(spec)
		return os.IsNotExist(err) && len(processesOf(t, node, string(pod.UID))) == 0, nil
	}); err != nil {
		_, statErr := os.Stat(spec)
		t.Fatalf("after the restart the deleted pod's claim spec (%v) or processes %v remain", statErr, processesOf(t, node, string(pod.UID)))
	}
}

// TestDRAClaimModes: a claim of each of the chart's classes — a whole GPU,
// an MPS slice, a time-sliced slice — on a playground of two H100 DRA
// nodes (the first running MPS), each pod created with its claim and timed
// from the claim's creation to the pod Running; and the ResourceSlice one
// node's agent published, as the API server returns it.
func TestDRAClaimModes(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 2, GPUsPerNode: 2, Model: "h100", MPSNodes: 1, DRANodes: 2})
	ctx := context.Background()
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 2, nil
	}); err != nil {
		t.Fatalf("no ResourceSlice of each node: %v", err)
	}
	const ns = "modes"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "cores": resource.MustParse("25")}
	for _, tc := range []struct {
		name, class string
		capacity    map[resourceapi.QualifiedName]resource.Quantity
		node        string // where the class's selector leaves room
		isolation   string
	}{
		{"whole", "whole.gpu.tessera.dev", nil, "", "memory=device,compute=device"},
		{"mps", "mps.gpu.tessera.dev", slice, c.Nodes[0].Name, "compute=mps-client"},
		{"time-sliced", "time-sliced.gpu.tessera.dev", slice, c.Nodes[1].Name, "compute=shim"},
	} {
		req := &resourceapi.ExactDeviceRequest{DeviceClassName: tc.class}
		if tc.capacity != nil {
			req.Capacity = &resourceapi.CapacityRequirements{Requests: tc.capacity}
		}
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}
		start := time.Now()
		claim, err := c.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		create(t, c.Client, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns},
			Spec: v1.PodSpec{SchedulerName: "tessera-scheduler", ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
				Containers: []v1.Container{{Name: "main", Image: "registry.example/infer", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}})
		pod := waitRunning(t, c.Client, ns, []string{tc.name}, time.Minute)[tc.name]
		took := time.Since(start)
		if tc.node != "" && pod.Spec.NodeName != tc.node {
			t.Errorf("%s claim's pod on %s, want %s", tc.name, pod.Spec.NodeName, tc.node)
		}
		b, err := os.ReadFile(dra.SpecPath(nodeOf(t, c, pod.Spec.NodeName).CDIDir, claim.UID))
		if err != nil || !strings.Contains(string(b), tc.isolation) {
			t.Errorf("%s claim's spec lacks %s: %v\n%s", tc.name, tc.isolation, err, b)
		}
		t.Logf("%-11s claim (%s): created to Running in %v, on %s", tc.name, tc.class, took.Round(time.Millisecond), pod.Spec.NodeName)
	}
	s, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.Nodes[0].Name})
	if err != nil || len(s.Items) != 1 {
		t.Fatalf("the ResourceSlice of %s: %v (%d)", c.Nodes[0].Name, err, len(s.Items))
	}
	s.Items[0].ManagedFields = nil
	y, err := yaml.Marshal(s.Items[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the ResourceSlice of %s (MPS) as the API server returns it:\n%s", c.Nodes[0].Name, y)
}

func nodeOf(t *testing.T, c *playground.Cluster, name string) *playground.Node {
	t.Helper()
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no playground node %s", name)
	return nil
}
