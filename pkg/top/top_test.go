package top

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	restclient "k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/pkg/agentendpoint"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

const agentMetrics = `# TYPE tessera_container_gpu_memory_used_bytes gauge
tessera_container_gpu_memory_used_bytes{UUID="GPU-a",container="main",gpu="0",modelName="m",namespace="ns",node="node-2",pod="infer"} 4.294967296e+09
# TYPE tessera_container_gpu_sm_utilization_ratio gauge
tessera_container_gpu_sm_utilization_ratio{UUID="GPU-a",container="main",gpu="0",modelName="m",namespace="ns",node="node-2",pod="infer"} 0.17
`

// proxied answers the API server's pod proxy with an agent's metrics.
type proxied string

func (p proxied) DoRaw(context.Context) ([]byte, error) { return []byte(p), nil }
func (p proxied) Stream(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(string(p))), nil
}

// TestUsageFromAgentPods: without URLs, usage comes from the running agent
// pods through the API server's proxy.
func TestUsageFromAgentPods(t *testing.T) {
	inv := &gpu.NodeInventory{Node: "node-2", GPUs: []gpu.Device{{Index: 0, UUID: "GPU-a", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8}}}
	raw, _ := gpu.EncodeInventory(inv)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2", Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}}}
	a := &gpu.PodAssignment{Node: "node-2", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeMPS,
		GPUs: []gpu.GPUGrant{{UUID: "GPU-a", MemoryMiB: 8192, CoresPerMille: 200}}}}}
	agentPod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tessera-agent-x", Namespace: agentendpoint.Namespace, Labels: map[string]string{"app.kubernetes.io/name": "tessera-agent"}},
		Status: v1.PodStatus{Phase: v1.PodRunning}}
	client := fake.NewClientset(node, gpuPod("infer", "node-2", a, nil), agentPod)
	var asked string
	client.PrependProxyReactor("pods", func(action k8stesting.Action) (bool, restclient.ResponseWrapper, error) {
		pa := action.(k8stesting.ProxyGetAction)
		asked = pa.GetName() + ":" + pa.GetPort() + "/" + pa.GetPath()
		return true, proxied(agentMetrics), nil
	})
	snap, err := Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := snap.AddUsageFromAgents(context.Background(), client); err != nil || n != 1 {
		t.Fatalf("%d agents, %v", n, err)
	}
	if asked != "tessera-agent-x:9401/metrics" {
		t.Errorf("proxied %q", asked)
	}
	if tn := snap.GPUs[0].Tenants[0]; !tn.Live || tn.UsedMiB != 4096 {
		t.Errorf("tenant %+v", tn)
	}
}

func gpuPod(name, node string, a *gpu.PodAssignment, ann map[string]string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{gpu.ResourceGPU: resource.MustParse("1")}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning}}
	if node == "" {
		p.Status.Phase = v1.PodPending
	}
	if a != nil {
		enc, _ := gpu.EncodeAssignment(a)
		p.Annotations[gpu.AnnotationAssignment] = enc
	}
	for k, v := range ann {
		p.Annotations[k] = v
	}
	return p
}

// TestCollectAndRender: each GPU with its mode, slices and grants, tenants
// below it, victims shown Preempting, live usage merged from an agent's
// metrics, pending pods counted.
func TestCollectAndRender(t *testing.T) {
	inv := &gpu.NodeInventory{Node: "node-2", GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-a", Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Healthy: true, Slices: 8, MPSCapable: true,
			Isolation: &gpu.IsolationOffer{MPSLimits: true}},
		{Index: 1, UUID: "GPU-b", Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Healthy: false, Slices: 8, MPSCapable: true},
	}}
	raw, _ := gpu.EncodeInventory(inv)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2", Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}}}
	mps := func(mem int64, cores int) *gpu.PodAssignment {
		return &gpu.PodAssignment{Node: "node-2", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeMPS,
			GPUs: []gpu.GPUGrant{{UUID: "GPU-a", Index: 0, MemoryMiB: mem, CoresPerMille: cores}}}}}
	}
	// The agent recorded the batch pod's slice held by the server (the
	// server at its 30 % / 16 GiB grant); infer has no record yet.
	batch := gpuPod("batch", "node-2", mps(16384, 300), map[string]string{preemption.AnnotationNotice: `{"preemptor":"ns/x"}`})
	batch.Status.Conditions = append(batch.Status.Conditions, v1.PodCondition{Type: gpu.ConditionIsolation, Status: v1.ConditionTrue,
		Message: "main on GPU-a: memory=mps-server,compute=mps-server"})
	client := fake.NewClientset(node,
		gpuPod("infer", "node-2", mps(8192, 200), nil),
		batch,
		gpuPod("waiting", "", nil, nil))
	snap, err := Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.GPUs) != 2 || snap.Pending != 1 || snap.GPUs[0].GrantedMiB() != 24576 || snap.GPUs[0].GrantedCores() != 50 || snap.GPUs[0].Mode() != "mps" {
		t.Fatalf("snapshot %+v", snap)
	}
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(agentMetrics))
	}))
	defer agent.Close()
	if err := snap.AddUsage(context.Background(), agent.URL); err != nil {
		t.Fatal(err)
	}
	text := render(t, snap)
	for _, want := range []string{
		"node-2  0    H100 80GB HBM3  mps", "2/8", "24576/81920", "50%",
		"ns/infer/main", "4096", "17%",
		"ns/batch/main", "Preempting",
		// batch as its agent recorded; infer, without a record, only by
		// its variables.
		"8192   20%    mps-client/mps-client", "16384  30%    mps-server/mps-server",
		"free (unhealthy)",
		"1 GPU pod(s) waiting for a slice",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
}

func render(t *testing.T, snap *Snapshot) string {
	t.Helper()
	var out strings.Builder
	if err := Render(&out, snap); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// TestRenderTellsTheTruth (issue 15): a pod that never started is shown as
// such and counted, an MPS GPU is labelled mps whatever a tenant's record
// says, a node whose inventory is unreadable is named with why, and memory
// oversubscription within what a configuration allows reads as such.
func TestRenderTellsTheTruth(t *testing.T) {
	inv := &gpu.NodeInventory{Node: "node-2", GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-a", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8, MPSCapable: true},
		{Index: 1, UUID: "GPU-b", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8},
	}}
	raw, _ := gpu.EncodeInventory(inv)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2", Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}}}
	broken := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-3", Annotations: map[string]string{gpu.AnnotationInventory: `{"v":"v1","gpus":[`}}}
	on := func(uuid string, mode gpu.SharingMode, mem int64, cores int) *gpu.PodAssignment {
		return &gpu.PodAssignment{Node: "node-2", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: mode,
			GPUs: []gpu.GPUGrant{{UUID: uuid, MemoryMiB: mem, CoresPerMille: cores}}}}}
	}
	refused := gpuPod("refused", "node-2", on("GPU-a", gpu.ModeTimeSlicing, 8192, 100), nil)
	refused.Status = v1.PodStatus{Phase: v1.PodPending, ContainerStatuses: []v1.ContainerStatus{{Name: "main",
		State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "RunContainerError", Message: "no Tessera GPU assignment covers this container"}}}}}
	rogue := gpuPod("rogue", "node-2", nil, nil)
	rogue.Spec.Containers[0].Resources.Limits[gpu.ResourceGPU] = resource.MustParse("2")
	client := fake.NewClientset(node, broken, refused, rogue,
		gpuPod("a", "node-2", on("GPU-b", gpu.ModeTimeSlicing, 61440, 300), nil),
		gpuPod("b", "node-2", on("GPU-b", gpu.ModeTimeSlicing, 40960, 300), nil))
	snap, err := Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	text := render(t, snap)
	for _, want := range []string{
		"node-2  0    H100   mps ",
		"ns/refused/main", "NotStarted (RunContainerError)",
		"1 GPU pod(s) hold slices but have not started",
		"102400/81920 (1.25× oversubscribed)",
		"61440  30%    none/none",
		"node-3: GPU inventory (tessera.dev/inventory) unreadable: ",
		"ns/rogue holds 2 GPU slot(s) of node-2 without a Tessera assignment",
		// Usage shown as - says why (issue 39).
		"3 tenant(s) without live usage (USED MiB, SM: -): no agent reported them; give the agents' metrics with --metrics",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "mps   1/8     8192/81920  10%    ns/refused/main  0      Running") {
		t.Errorf("the pod that never started is shown Running:\n%s", text)
	}
}

// TestClaimTenants: a GPU held through a gpu.tessera.dev ResourceClaim
// shows its tenant (the pod it is reserved for, and the claim), with what
// the claim consumed and what holds it for claims; a whole-GPU claim makes
// its GPU exclusive; a claim list refused is said, not taken for none.
func TestClaimTenants(t *testing.T) {
	inv := &gpu.NodeInventory{Node: "node-2", GPUs: []gpu.Device{
		{Index: 0, UUID: "GPU-a", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8,
			Isolation: &gpu.IsolationOffer{KernelMemoryLimits: true, Shim: true}},
		{Index: 1, UUID: "GPU-b", Model: "H100", MemoryMiB: 81920, Healthy: true, Slices: 8},
	}}
	raw, _ := gpu.EncodeInventory(inv)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2", Annotations: map[string]string{gpu.AnnotationInventory: string(raw)}}}
	claim := func(name, device string, consumed map[resourceapi.QualifiedName]string) *resourceapi.ResourceClaim {
		r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: gpu.DRADriver, Pool: "node-2", Device: device,
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range consumed {
			r.ConsumedCapacity[k] = resource.MustParse(v)
		}
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{r}}},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + name}}}}
	}
	running := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-slice", Namespace: "ns"}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	other := claim("nic", "eth0", nil)
	other.Status.Allocation.Devices.Results[0].Driver = "net.example.com"
	shared := claim("shared", "gpu-0", map[resourceapi.QualifiedName]string{"memory": "20Gi", "cores": "25", "slices": "1"})
	shared.Status.ReservedFor = append(shared.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-shared-2"})
	client := fake.NewClientset(node, running, claim("slice", "gpu-0", map[resourceapi.QualifiedName]string{"memory": "10Gi", "cores": "25", "slices": "1"}),
		claim("whole", "gpu-1", map[resourceapi.QualifiedName]string{"memory": "80Gi", "cores": "100", "slices": "1"}), other, shared)
	snap, err := Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(snap.GPUs[0].Tenants, func(t Tenant) bool { return t.Claim == "slice" })
	if n := len(snap.GPUs[0].Tenants); n != 2 || i < 0 || snap.GPUs[0].Tenants[i].Pod != "pod-slice" ||
		snap.GPUs[0].Tenants[i].MemoryMiB != 10240 || snap.GPUs[0].Tenants[i].CoresPercent != 25 || snap.GPUs[0].Mode() != "time-slicing" {
		t.Errorf("GPU 0's tenants %+v, mode %s; want the slice claim's 10240 MiB and 25 %%, time-sliced, and the shared one", snap.GPUs[0].Tenants, snap.GPUs[0].Mode())
	}
	if snap.GPUs[1].Mode() != "exclusive" || snap.GPUs[1].GrantedCores() != 100 {
		t.Errorf("GPU 1 with a whole-GPU claim: mode %s, cores %d", snap.GPUs[1].Mode(), snap.GPUs[1].GrantedCores())
	}
	if f := snap.Fragmentation; f.FreeGPUs > 0.5+1e-9 {
		t.Errorf("free GPUs %.2f: the claims' GPUs count as taken (want at most 0.5)", f.FreeGPUs)
	}
	text := render(t, snap)
	// The kernel's limits hold a claim of one pod, as a device-plugin
	// pod's; a claim shared by two pods has no one cgroup: the shim.
	for _, want := range []string{"ns/pod-slice (claim slice)", "Running", "10240  25%    kernel/shim", "ns/pod-shared (claim shared)", "20480  25%    shim/shim",
		"ns/pod-whole (claim whole)", "Reserved"} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "nic") {
		t.Errorf("another driver's claim shown:\n%s", text)
	}

	client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "", errors.New("no"))
	})
	snap, err = Collect(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	if text := render(t, snap); !strings.Contains(text, "ResourceClaims could not be listed") || !strings.Contains(text, "look free here") {
		t.Errorf("a refused claim list is not said:\n%s", text)
	}
}
