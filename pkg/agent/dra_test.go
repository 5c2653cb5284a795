package agent

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/nvml/nvmltest"
)

// draAgent runs an agent with --dra=node-label on a DGX H100 mock, its
// node labelled as given, until the test ends.
func draAgent(t *testing.T, labelled bool, podsOn ...func(*server.Server) *v1.Pod) (*fake.Clientset, *Agent, string) {
	return draAgentWith(t, DRANodeLabel, labelled, "", podsOn...)
}

// draAgentWith is draAgent with a checkpoint of prepared claims already in
// the plugin directory (as a previous agent left it), when not empty.
func draAgentWith(t *testing.T, mode DRAMode, labelled bool, checkpoint string, podsOn ...func(*server.Server) *v1.Pod) (*fake.Clientset, *Agent, string) {
	t.Helper()
	srv := dgxh100.New()
	var pods []*v1.Pod
	for _, on := range podsOn {
		pods = append(pods, on(srv))
	}
	nvmltest.Install(srv, func(int) *nvmltest.Reading { return &nvmltest.Reading{SMCount: 132, NVLink: true} })
	// Faults come from the test (Observe), not an event watch.
	srv.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
	client := newNode()
	if labelled {
		n, _ := client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		n.Labels = map[string]string{dra.NodeLabel: "true"}
		if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	plugins, err := os.MkdirTemp("", "dra") // a socket's path must be short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(plugins) })
	if checkpoint != "" {
		if err := os.WriteFile(filepath.Join(plugins, "claims.json"), []byte(checkpoint), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, err := New(Options{Node: "n1", Config: config.Default(), Client: client, NVML: srv, CDIDir: t.TempDir(),
		DRA: DRAOptions{Mode: mode, PluginDir: plugins}, NodePods: func() []*v1.Pod { return pods }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, t.TempDir(), "") }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return client, a, plugins
}

func sliceDevices(t *testing.T, client *fake.Clientset, ok func([]resourceapi.Device) bool) []resourceapi.Device {
	t.Helper()
	var devs []resourceapi.Device
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return false, nil
		}
		devs = l.Items[0].Spec.Devices
		return ok(devs), nil
	})
	if err != nil {
		t.Fatalf("no ResourceSlice as wanted (last devices %d): %v", len(devs), err)
	}
	return devs
}

// TestDRANodeServesGPUsAsDevices: a node labelled for DRA publishes its
// GPUs as one ResourceSlice and serves the driver's socket, not the
// device plugin's; an XID taints the GPU's device at once, and its
// recovery lifts the taint.
func TestDRANodeServesGPUsAsDevices(t *testing.T) {
	client, a, plugins := draAgent(t, true)
	devs := sliceDevices(t, client, func(d []resourceapi.Device) bool { return len(d) == 8 })
	// The default configuration oversubscribes memory 1.5×; no claim
	// takes more than the GPU's 80 GiB.
	mem := devs[0].Capacity[dra.CapacityMemory]
	if devs[0].Name != "gpu-0" || *devs[0].Attributes["model"].StringValue == "" || mem.Value.String() != "120Gi" || mem.RequestPolicy.ValidRange.Max.String() != "80Gi" {
		t.Errorf("device 0: %s, model %q, memory %s at most %s per claim", devs[0].Name, *devs[0].Attributes["model"].StringValue, mem.Value.String(), mem.RequestPolicy.ValidRange.Max)
	}
	if _, err := os.Stat(dra.SocketPath(plugins)); err != nil {
		t.Errorf("the driver's socket: %v", err)
	}
	// The inventory says so: tessera-scheduler places no tessera.dev/gpu
	// pod here.
	if inv := published(t, client); !inv.DRA || len(inv.GPUs) != 8 {
		t.Errorf("the DRA node's inventory: DRA %v, %d GPUs", inv.DRA, len(inv.GPUs))
	}
	// A prepared claim holds a slice of its GPU, as the metrics count it.
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "claim-uid"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: dra.DriverName, Pool: "n1", Device: "gpu-1",
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "cores": resource.MustParse("25")}}}}}}}
	res, err := a.draDriver.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil || res[claim.UID].Err != nil {
		t.Fatalf("prepare: %v %v", err, res[claim.UID].Err)
	}
	if got := a.slices()[a.devices[1].UUID].Allocated; got != 1 {
		t.Errorf("GPU 1 with a prepared claim: %d slices allocated, want 1", got)
	}
	// The agent's endpoint exports the driver's series.
	rec := httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`tessera_dra_claims_prepared{node="n1"} 1`, `tessera_dra_prepare_refusals_total{node="n1",reason="overcommitted"} 0`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("the agent's metrics lack %s", want)
		}
	}
	t0 := time.Now()
	uuid := a.devices[3].UUID
	a.Observe(context.Background(), nvml.Event{UUID: uuid, Type: gonvml.EventTypeXidCriticalError, Xid: 79}, t0)
	sliceDevices(t, client, func(d []resourceapi.Device) bool {
		return len(d) == 8 && len(d[3].Taints) == 1 && d[3].Taints[0].Key == dra.TaintUnhealthy && len(d[2].Taints) == 0
	})
	if err := a.Refresh(context.Background(), t0.Add(time.Second+a.opts.Config.Health.QuietPeriod.Duration)); err != nil {
		t.Fatal(err)
	}
	sliceDevices(t, client, func(d []resourceapi.Device) bool { return len(d) == 8 && len(d[3].Taints) == 0 })
}

// TestUnlabelledNodeKeepsTheDevicePlugin: with --dra=node-label and no
// label, no ResourceSlice is published and the driver does not serve.
func TestUnlabelledNodeKeepsTheDevicePlugin(t *testing.T) {
	client, a, plugins := draAgent(t, false)
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return a.pub.Published() != nil, nil
	}); err != nil {
		t.Fatal("the agent published no inventory")
	}
	time.Sleep(200 * time.Millisecond)
	if l, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("an unlabelled node published ResourceSlices: %d (%v)", len(l.Items), err)
	}
	if _, err := os.Stat(dra.SocketPath(plugins)); !os.IsNotExist(err) {
		t.Errorf("the driver serves on an unlabelled node: %v", err)
	}
	if inv := published(t, client); inv.DRA {
		t.Error("an unlabelled node's inventory says it serves DRA")
	}
}

// TestMovedNodeKeepsItsPods: a node moved from the device plugin to DRA
// keeps the pods tessera-scheduler placed there; its ResourceSlice offers
// claims only what they leave: a GPU one holds whole is tainted, one a
// slice is on offers the rest.
func TestMovedNodeKeepsItsPods(t *testing.T) {
	running := func(srv *server.Server) *v1.Pod {
		uuid0, _ := srv.Devices[0].GetUUID()
		uuid1, _ := srv.Devices[1].GetUUID()
		enc, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: "n1", Containers: []gpu.ContainerAssignment{
			{Name: "whole", Mode: gpu.ModeExclusive, GPUs: []gpu.GPUGrant{{UUID: uuid0, MemoryMiB: 81920, CoresPerMille: 1000}}},
			{Name: "slice", Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: uuid1, Index: 1, MemoryMiB: 20480, CoresPerMille: 250}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "before", Annotations: map[string]string{gpu.AnnotationAssignment: enc}},
			Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "whole"}, {Name: "slice"}}}}
	}
	client, _, _ := draAgent(t, true, running)
	devs := sliceDevices(t, client, func(d []resourceapi.Device) bool { return len(d) == 8 })
	if len(devs[0].Taints) != 1 || devs[0].Taints[0].Key != dra.TaintHeld {
		t.Errorf("GPU 0, held whole by a running pod: taints %+v, want %s", devs[0].Taints, dra.TaintHeld)
	}
	mem, cores := devs[1].Capacity[dra.CapacityMemory], devs[1].Capacity[dra.CapacityCores]
	// 80 GiB × 1.5 (the default oversubscription) − 20 GiB; 100 % − 25 %.
	if mem.Value.String() != "100Gi" || cores.Value.String() != "75" || cores.RequestPolicy.Default.String() != "75" || len(devs[1].Taints) != 0 {
		t.Errorf("GPU 1, 20 GiB and 25 %% held: memory %s, cores %s (a whole claim takes %s), taints %v; want 100Gi, 75, 75, none",
			mem.Value.String(), cores.Value.String(), cores.RequestPolicy.Default, devs[1].Taints)
	}
	if mem := devs[2].Capacity[dra.CapacityMemory]; mem.Value.String() != "120Gi" {
		t.Errorf("GPU 2, untouched: memory %s", mem.Value.String())
	}
}

// TestMovedBackWithClaims: a node whose label was removed while claims are
// still prepared there keeps serving DRA (kubelet must be able to
// unprepare them), and says so.
func TestMovedBackWithClaims(t *testing.T) {
	checkpoint := `{"version": 1, "claims": {"claim-uid": {"namespace": "ns", "name": "c", "state": "prepared",
		"devices": [{"request": "gpu", "pool": "n1", "device": "gpu-0", "memoryMiB": 1024, "cores": 10}], "cdiDevice": "tessera.dev/claim=claim-uid"}}}`
	client, _, plugins := draAgentWith(t, DRANodeLabel, false, checkpoint)
	sliceDevices(t, client, func(d []resourceapi.Device) bool { return len(d) == 8 })
	if _, err := os.Stat(dra.SocketPath(plugins)); err != nil {
		t.Errorf("the driver's socket: %v", err)
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.Reason == "DRAClaimsStillPrepared" && strings.Contains(e.Message, "1 gpu.tessera.dev claim(s) are still prepared here") {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error("no DRAClaimsStillPrepared event on the node")
	}
}

// TestDRAAlways: --dra=always serves DRA on a node without the label;
// --dra=never does not, even on a labelled one.
func TestDRAAlways(t *testing.T) {
	client, _, plugins := draAgentWith(t, DRAAlways, false, "")
	sliceDevices(t, client, func(d []resourceapi.Device) bool { return len(d) == 8 })
	if _, err := os.Stat(dra.SocketPath(plugins)); err != nil {
		t.Errorf("the driver's socket with --dra=always: %v", err)
	}
	if inv := published(t, client); !inv.DRA {
		t.Error("the inventory of an --dra=always node does not say DRA")
	}
	client, a, plugins := draAgentWith(t, DRANever, true, "")
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return a.pub.Published() != nil, nil
	}); err != nil {
		t.Fatal("the agent published no inventory")
	}
	if l, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("--dra=never published ResourceSlices on a labelled node: %d (%v)", len(l.Items), err)
	}
	if _, err := os.Stat(dra.SocketPath(plugins)); !os.IsNotExist(err) {
		t.Errorf("--dra=never serves the driver: %v", err)
	}
}

func TestParseDRAMode(t *testing.T) {
	for _, s := range []string{"never", "always", "node-label"} {
		if m, err := ParseDRAMode(s); err != nil || string(m) != s {
			t.Errorf("ParseDRAMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseDRAMode("yes"); err == nil {
		t.Error("ParseDRAMode(yes) accepted")
	}
}
