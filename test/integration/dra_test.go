package integration

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
)

type fixedInventory struct{ inv *gpu.NodeInventory }

func (f fixedInventory) Published() *gpu.NodeInventory { return f.inv }

type sourcesNeverReady struct{}

func (sourcesNeverReady) AddSource(string)           {}
func (sourcesNeverReady) AllReady() bool             { return false }
func (sourcesNeverReady) SeenAllSources(string) bool { return false }

// draNode is a node of three 80 GiB GPUs served by the agent's DRA
// driver, moved from the device plugin: a running pod holds the whole of
// GPU 1, another 20 GiB and 25 % of GPU 2; tessera-scheduler runs with
// the shipped (standalone) configuration.
type draNode struct {
	c              *cluster
	inv            *gpu.NodeInventory
	d              *dra.Driver
	plugin, cdiDir string
	// scheduler is the profile submit's pods name (tessera-scheduler).
	scheduler string
}

func startDRANode(t *testing.T) *draNode {
	c := startCluster(t)
	c.registerNode("n1")
	inv := nodeInventory(gpuNode{name: "n1", gpus: 3, memMi: 81920})
	c.createShippedDeviceClasses()

	plugin, err := os.MkdirTemp("", "dra") // a socket's path must be short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(plugin) })
	cdiDir := t.TempDir()
	d, err := dra.New(dra.Config{Node: "n1", CDIDir: cdiDir, StateDir: plugin, Inventory: fixedInventory{inv}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := dra.Serve(c.ctx, d, dra.ServeOptions{Client: c.client, PluginDir: plugin, Policy: dra.Policy{MinMemoryMiB: 4096, MemoryOversubscription: 1.5}}) // the chart's: both sides default to 1.5
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	// The node moved from the device plugin: a running pod holds the
	// whole of GPU 1, another 20 GiB and 25 % of GPU 2.
	held := map[string]dra.Held{
		inv.GPUs[1].UUID: {MemoryMiB: 81920, CoresPerMille: 1000, Containers: 1},
		inv.GPUs[2].UUID: {MemoryMiB: 20480, CoresPerMille: 250, Containers: 1},
	}
	if err := srv.Publish(c.ctx, inv, held); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 1 && len(l.Items[0].Spec.Devices) == 3, nil
	}); err != nil {
		t.Fatalf("the API server holds no ResourceSlice of 3 devices from the driver: %v", err)
	}

	// The agent's inventory of a DRA node says so: tessera-scheduler
	// places no tessera.dev/gpu pod there, and says why.
	inv.DRA = true
	if _, err := inventory.Publish(c.ctx, c.client, inv); err != nil {
		t.Fatal(err)
	}
	c.startScheduler("")
	return &draNode{c: c, inv: inv, d: d, plugin: plugin, cdiDir: cdiDir, scheduler: tesseraScheduler}
}

// createShippedDeviceClasses creates the chart's DeviceClasses.
func (c *cluster) createShippedDeviceClasses() {
	c.t.Helper()
	objs, err := deploy.Objects(deploy.Agent)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() != "DeviceClass" {
			continue
		}
		var dc resourceapi.DeviceClass
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &dc); err != nil {
			c.t.Fatal(err)
		}
		if _, err := c.client.ResourceV1().DeviceClasses().Create(c.ctx, &dc, metav1.CreateOptions{}); err != nil {
			c.t.Fatalf("the chart's DeviceClass %s: %v", dc.Name, err)
		}
	}
}

// submit creates a claim of the chart's gpu.tessera.dev class asking
// capacity, and a pod of n.scheduler that uses it.
func (n *draNode) submit(t *testing.T, name string, capacity map[resourceapi.QualifiedName]string) {
	t.Helper()
	c := n.c
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: dra.DriverName, Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}}
	for k, v := range capacity {
		req.Capacity.Requests[k] = resource.MustParse(v)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}
	if _, err := c.client.ResourceV1().ResourceClaims("default").Create(c.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{SchedulerName: n.scheduler, ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}}
	if _, err := c.client.CoreV1().Pods("default").Create(c.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// allocatedDevice is the device claim name's allocation took, "" while it
// has none.
func (n *draNode) allocatedDevice(t *testing.T, name string) string {
	t.Helper()
	claim, err := n.c.client.ResourceV1().ResourceClaims("default").Get(n.c.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := claim.Status.Allocation; a != nil && len(a.Devices.Results) == 1 {
		return a.Devices.Results[0].Device
	}
	return ""
}

// TestDRAFirstFitUpstream is TestDRAClaimsThroughTheRealParts's control:
// the same node and claims, their pods scheduled by the standalone
// configuration's default-scheduler profile, where upstream's
// DynamicResources allocates. The slice takes GPU 0, the first device
// that fits, and the whole GPU then fits nowhere.
func TestDRAFirstFitUpstream(t *testing.T) {
	n := startDRANode(t)
	n.scheduler = "default-scheduler"
	n.submit(t, "slice", map[resourceapi.QualifiedName]string{"memory": "10Gi", "cores": "25"})
	n.c.waitBound("default", []string{"slice"}, 60*time.Second)
	if got := n.allocatedDevice(t, "slice"); got != "gpu-0" {
		t.Errorf("upstream's first fit put the slice on %q; want gpu-0", got)
	}
	n.submit(t, "whole", map[resourceapi.QualifiedName]string{"cores": "100"})
	if err := wait.PollUntilContextTimeout(n.c.ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(n.c.unschedulableMessage("default", "whole"), "cannot allocate all claims"), nil
	}); err != nil {
		t.Errorf("the whole-GPU pod after first fit: %q; want it unschedulable", n.c.unschedulableMessage("default", "whole"))
	}
}

// TestDRAClaimsThroughTheRealParts: the agent's DRA driver publishes its
// node's ResourceSlice to the real API server (which validates its
// capacities, request policies and taints), tessera-scheduler as shipped
// allocates claims of the chart's DeviceClass on it (TesseraGPU, with
// upstream's DynamicResources disabled in its profile) on the GPU the
// gradient ranks first, and binds their pods, and
// kubelet's DRA manager has the driver prepare them: each container gets
// the CDI device whose spec holds exactly what its claim consumed, on
// the GPU the slice left room on.
func TestDRAClaimsThroughTheRealParts(t *testing.T) {
	n := startDRANode(t)
	c, inv, d, plugin, cdiDir := n.c, n.inv, n.d, n.plugin, n.cdiDir
	c.createPod("default", podSpec{name: "plugin-pod", gpus: 1})
	if err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(c.unschedulableMessage("default", "plugin-pod"), "the node serves DRA claims; ask there with a ResourceClaim"), nil
	}); err != nil {
		t.Errorf("a tessera.dev/gpu pod on the only (DRA) node: %q; want it refused for serving DRA", c.unschedulableMessage("default", "plugin-pod"))
	}
	// The slice first: upstream's allocator alone takes the first device
	// that fits, GPU 0, and the whole GPU then finds none
	// (TestDRAFirstFitUpstream); TesseraGPU ranks GPU 2, the one already
	// shared, first, and keeps GPU 0 whole.
	n.submit(t, "slice", map[resourceapi.QualifiedName]string{"memory": "10Gi", "cores": "25"})
	c.waitBound("default", []string{"slice"}, 60*time.Second)
	// Every core: only GPU 0 has them all.
	n.submit(t, "whole", map[resourceapi.QualifiedName]string{"cores": "100"})
	bound := c.waitBound("default", []string{"slice", "whole"}, 60*time.Second)

	m, err := kubeletdra.NewManager(klog.Background(), c.client, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return c.client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	}
	if err := m.Start(c.ctx, func() []*v1.Pod { return nil }, getNode, sourcesNeverReady{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	if err := m.GetWatcherHandler().RegisterPlugin(c.ctx, dra.DriverName, dra.SocketPath(plugin), []string{drapbv1.DRAPluginService}, nil); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		device string
		env    []string
	}{
		"slice": {"gpu-2", []string{"NVIDIA_VISIBLE_DEVICES=" + inv.GPUs[2].UUID, "TESSERA_GPU_MEMORY_LIMIT_MIB=0=10240", "TESSERA_GPU_CORES_PERCENT=0=25"}},
		"whole": {"gpu-0", []string{"NVIDIA_VISIBLE_DEVICES=" + inv.GPUs[0].UUID, "TESSERA_GPU_ISOLATION=0:memory=device,compute=device"}},
	} {
		claim, err := c.client.ResourceV1().ResourceClaims("default").Get(c.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Device != want.device || a.Devices.Results[0].ShareID == nil {
			t.Fatalf("claim %s allocated %+v; want a share of %s", name, claim.Status.Allocation, want.device)
		}
		pod := bound[name]
		if err := m.PrepareResources(c.ctx, pod); err != nil {
			t.Fatalf("kubelet preparing pod %s: %v", name, err)
		}
		info, err := m.GetResources(pod, &pod.Spec.Containers[0])
		if err != nil || len(info.CDIDevices) != 1 || info.CDIDevices[0].Name != dra.CDIKind+"="+string(claim.UID) {
			t.Fatalf("pod %s's container gets %+v (%v); want its claim's CDI device", name, info, err)
		}
		b, err := os.ReadFile(dra.SpecPath(cdiDir, claim.UID))
		if err != nil {
			t.Fatal(err)
		}
		var spec specs.Spec
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		env := strings.Join(spec.Devices[0].ContainerEdits.Env, " ")
		for _, kv := range want.env {
			if !strings.Contains(env+" ", kv+" ") {
				t.Errorf("pod %s's spec lacks %s: %s", name, kv, env)
			}
		}
		t.Logf("pod %s: claim on %s consumed %v; container env %s", name, want.device, claim.Status.Allocation.Devices.Results[0].ConsumedCapacity, env)
		if err := m.UnprepareResources(c.ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	if got := d.Prepared(); len(got) != 0 {
		t.Errorf("claims left prepared: %v", got)
	}
}
