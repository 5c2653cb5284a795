package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// allocatedClaim is a claim allocated a slice (memory, cores) of device on
// node n1, reserved for pods.
func allocatedClaim(name, device, memory, cores string, pods ...types.UID) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "lab", UID: types.UID("claim-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: "n1", Device: device,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory), "cores": resource.MustParse(cores)}}}}}}}
	for i, uid := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + name + string(rune('a'+i)), UID: uid})
	}
	return c
}

// serveDRA makes the agent serve DRA claims, with its plugin directory
// (short: it holds a socket) and CDI directory the test's.
func serveDRA(t *testing.T, o *Options) {
	t.Helper()
	plugins, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(plugins) })
	o.DRA, o.CDIDir = DRAOptions{Mode: DRAAlways, PluginDir: plugins}, t.TempDir()
}

// prepareClaim has the agent's driver prepare c, as kubelet asks.
func prepareClaim(t *testing.T, a *Agent, c *resourceapi.ResourceClaim) error {
	t.Helper()
	res, err := a.draDriver.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	return res[c.UID].Err
}

func unprepareClaim(t *testing.T, a *Agent, c *resourceapi.ResourceClaim) {
	t.Helper()
	res, err := a.draDriver.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}})
	if err != nil || res[c.UID] != nil {
		t.Fatalf("unprepare %s: %v %v", c.Name, err, res[c.UID])
	}
}

// claimIsolation is what the claim's CDI spec tells its containers holds
// their slices (TESSERA_GPU_ISOLATION).
func claimIsolation(t *testing.T, a *Agent, c *resourceapi.ResourceClaim) string {
	t.Helper()
	b, err := os.ReadFile(dra.SpecPath(a.opts.CDIDir, c.UID))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "TESSERA_GPU_ISOLATION=")
	if !ok {
		t.Fatalf("the claim's spec gives no TESSERA_GPU_ISOLATION:\n%s", b)
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// TestClaimKernelMemoryLimits: a time-sliced claim reserved for one pod
// has that pod's cgroup hold its memory through the kernel's limit, set
// when the claim is prepared (kubelet makes the pod's cgroup first), as a
// device-plugin pod's is, and its containers are told so; a claim shared
// by two pods gets no kernel limit (no one cgroup holds it) and says so,
// while its grant still counts in the GPU's total, so an oversubscribed
// GPU's soft limits leave it its share; a pod whose cgroup is missing has
// its claim refused; an unprepared claim's limit is removed.
func TestClaimKernelMemoryLimits(t *testing.T) {
	ctx := context.Background()
	n := newIsolationNodeWith(t, func(o *Options) { serveDRA(t, o) })
	if err := n.a.Refresh(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	lim := n.readings[0].Limits
	own := types.UID("7d1f3c52-0b8e-4f57-9b0a-111111111111")
	ownCg := podCgroup(t, n.root, own)
	one := allocatedClaim("one", "gpu-0", "60Gi", "25", own)
	if err := prepareClaim(t, n.a, one); err != nil {
		t.Fatal(err)
	}
	if soft, hard, ok := lim.Limit(ownCg); !ok || hard != 60*gib || soft != 60*gib {
		t.Fatalf("the claim's pod cgroup: soft %d hard %d (set %v), want 60 GiB both", soft, hard, ok)
	}
	if got := claimIsolation(t, n.a, one); !strings.Contains(got, "memory=kernel") {
		t.Errorf("the claim's containers are told %q, want memory=kernel", got)
	}

	// Shared by two pods: no kernel limit on either, and not claimed.
	p1, p2 := types.UID("7d1f3c52-0b8e-4f57-9b0a-222222222222"), types.UID("7d1f3c52-0b8e-4f57-9b0a-333333333333")
	cg1, cg2 := podCgroup(t, n.root, p1), podCgroup(t, n.root, p2)
	shared := allocatedClaim("shared", "gpu-0", "60Gi", "25", p1, p2)
	if err := prepareClaim(t, n.a, shared); err != nil {
		t.Fatal(err)
	}
	for _, cg := range []string{cg1, cg2} {
		if _, _, ok := lim.Limit(cg); ok {
			t.Errorf("a pod sharing a claim got a kernel limit on %s", cg)
		}
	}
	if got := claimIsolation(t, n.a, shared); !strings.Contains(got, "memory=none") {
		t.Errorf("the shared claim's containers are told %q, want memory=none (no shim on this node)", got)
	}
	// 120 GiB granted on an 80 GiB GPU (oversubscribed 1.5×): the claim of
	// one pod is guaranteed its share, 60 × 80/120 = 40 GiB.
	n.a.enforcer.Reconcile(ctx)
	if soft, hard, _ := lim.Limit(ownCg); hard != 60*gib || soft != 40*gib {
		t.Errorf("with the shared claim beside it: soft %d hard %d, want 40 GiB soft, 60 GiB hard", soft>>30, hard>>30)
	}

	// No cgroup for the pod: refused, not run unlimited.
	lost := allocatedClaim("lost", "gpu-1", "8Gi", "25", types.UID("7d1f3c52-0b8e-4f57-9b0a-444444444444"))
	if err := prepareClaim(t, n.a, lost); err == nil || !strings.Contains(err.Error(), "cgroup was not found") {
		t.Errorf("a claim whose pod has no cgroup: %v, want refused", err)
	}

	// Unprepared: the limit goes at the next reconciliation; the shared
	// claim leaving gives the other its whole grant as guaranteed.
	unprepareClaim(t, n.a, shared)
	n.a.enforcer.Reconcile(ctx)
	if soft, hard, _ := lim.Limit(ownCg); hard != 60*gib || soft != 60*gib {
		t.Errorf("alone again: soft %d hard %d GiB, want 60 both", soft>>30, hard>>30)
	}
	unprepareClaim(t, n.a, one)
	n.a.enforcer.Reconcile(ctx)
	if _, _, ok := lim.Limit(ownCg); ok {
		t.Error("an unprepared claim's kernel limit stayed")
	}
}

// TestClaimsCountInMPSServerLimits: an MPS GPU's server limits count the
// claims prepared on it with the device plugin's pods (a node moved to
// DRA keeps its running pods): a claim larger than every pod raises them
// to its grant when it is prepared, the reconciliation keeps them there
// while it is prepared (limits for the pods alone would take from it:
// MPS holds a client to the server's lower limit), and lowers them when
// it is unprepared. The claim's containers are told what holds them
// without counting on the server: its limits may rise before they
// connect. Run on the MPS stand-in.
func TestClaimsCountInMPSServerLimits(t *testing.T) {
	ctx := context.Background()
	srv, n, a := mpsAgent(t, func(o *Options) { serveDRA(t, o) })
	if err := a.Refresh(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	uuid, _ := srv.Devices[0].GetUUID()
	server := func() gpu.MPSServerLimits { l, _ := a.mpsMgr.ServerLimits(uuid); return l }

	// A device-plugin pod from before the move: 30 %, 4 GiB.
	g := gpu.GPUGrant{UUID: uuid, MemoryMiB: 4096, CoresPerMille: 300}
	p, _ := n.pod(t, "small-1", gpu.ModeMPS, g, false)
	if _, err := a.enforcer.Isolate(ctx, p, gpu.ContainerAssignment{Name: "main", Mode: gpu.ModeMPS, GPUs: []gpu.GPUGrant{g}}); err != nil {
		t.Fatal(err)
	}
	if got := server(); got != (gpu.MPSServerLimits{ThreadPercent: 30, MemoryMiB: 4096}) {
		t.Fatalf("server with the pod alone: %+v", got)
	}
	big := allocatedClaim("big", "gpu-0", "16Gi", "60", "7d1f3c52-0b8e-4f57-9b0a-555555555555")
	if err := prepareClaim(t, a, big); err != nil {
		t.Fatal(err)
	}
	want := gpu.MPSServerLimits{ThreadPercent: 60, MemoryMiB: 16384}
	if got := server(); got != want {
		t.Errorf("server once the claim is prepared: %+v, want %+v", got, want)
	}
	a.enforcer.Reconcile(ctx)
	if got := server(); got != want {
		t.Errorf("server after a reconciliation with the claim prepared: %+v, want %+v (the claim's grant)", got, want)
	}
	if got := claimIsolation(t, a, big); !strings.Contains(got, "compute=mps-client") {
		t.Errorf("the MPS claim's containers are told %q, want compute=mps-client", got)
	}
	unprepareClaim(t, a, big)
	a.enforcer.Reconcile(ctx)
	if got := server(); got != (gpu.MPSServerLimits{ThreadPercent: 30, MemoryMiB: 4096}) {
		t.Errorf("server after the claim was unprepared: %+v, want the pod's 30 %% / 4096 MiB again", got)
	}
}

// TestClaimSlicesReported: what holds a claim's slice is said as for a
// device-plugin pod's: on its pod (the GPUIsolation condition, naming the
// containers given the claim) and in the agent's series (the grant and
// the mechanism per container), from the claim's preparation on; a
// container not given the claim is not named; an unprepared claim's
// series go.
func TestClaimSlicesReported(t *testing.T) {
	ctx := context.Background()
	var pods []*v1.Pod
	n := newIsolationNodeWith(t, func(o *Options) {
		serveDRA(t, o)
		o.Pods = func(ns, name string) *v1.Pod {
			for _, p := range pods {
				if p.Namespace == ns && p.Name == name {
					return p
				}
			}
			return nil
		}
		nodePods := o.NodePods
		o.NodePods = func() []*v1.Pod { return append(nodePods(), pods...) }
	})
	if err := n.a.Refresh(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	uid := types.UID("7d1f3c52-0b8e-4f57-9b0a-666666666666")
	podCgroup(t, n.root, uid)
	claimName := "train-gpu"
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "train", UID: uid},
		Spec: v1.PodSpec{NodeName: "n1", SchedulerName: "tessera-scheduler", ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claimName}},
			Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}, {Name: "sidecar"}}},
		Status: v1.PodStatus{Phase: v1.PodPending}}
	if _, err := n.a.opts.Client.CoreV1().Pods("lab").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods = append(pods, pod)
	claim := allocatedClaim("train-gpu", "gpu-0", "20Gi", "25", uid)
	claim.Status.ReservedFor[0].Name = "train"
	if err := prepareClaim(t, n.a, claim); err != nil {
		t.Fatal(err)
	}
	uuid := n.uuids[0]
	if c := isolationCondition(t, n.a, "lab", "train"); c.Status != v1.ConditionFalse ||
		!strings.Contains(c.Message, "main on "+uuid+": memory=kernel,compute=none") || strings.Contains(c.Message, "sidecar") {
		t.Errorf("the claim's pod condition %+v", c)
	}
	mech := isolationSeries(t, n.a)
	if got := mech["train/"+uuid+"/memory"]; got != "kernel" {
		t.Errorf("tessera_slice_isolation for the claim's memory = %q, want kernel (all: %v)", got, mech)
	}
	grants := grantSeries(t, n.a)
	if got, want := grants["train/main/"+uuid], fmt.Sprintf("%d/0.25", 20*gib); got != want {
		t.Errorf("the claim's grant series = %q, want %q (all: %v)", got, want, grants)
	}
	if _, ok := grants["train/sidecar/"+uuid]; ok {
		t.Error("a container not given the claim has its grant")
	}
	unprepareClaim(t, n.a, claim)
	if grants := grantSeries(t, n.a); len(grants) != 0 {
		t.Errorf("series after the unprepare: %v", grants)
	}
}
