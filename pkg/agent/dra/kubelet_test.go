package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/agent/shim"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// staticInventory is a published inventory that tests change.
type staticInventory struct {
	mu  sync.Mutex
	inv *gpu.NodeInventory
}

func (s *staticInventory) Published() *gpu.NodeInventory {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inv
}

// node is one node's kubelet DRA manager (pkg/kubelet/cm/dra, as kubelet
// runs it) talking to the agent's driver over its socket, and the
// node's ResourceSlice, published by the driver through the API.
type node struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	inv      *staticInventory
	driver   *Driver
	server   *Server
	manager  *kubeletdra.Manager
	cfg      Config
	plugin   string
	shimRoot string
	// noticeRoot holds pods' preemption notice directories.
	noticeRoot string
	claims     []*resourceapi.ResourceClaim // allocated so far
	podsMu     sync.Mutex
	pods       map[string]*v1.Pod // the agent's view of the node's pods
}

type neverReady struct{}

func (neverReady) AddSource(string)           {}
func (neverReady) AllReady() bool             { return false }
func (neverReady) SeenAllSources(string) bool { return false }

func startNode(t *testing.T) *node {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	t.Cleanup(cancel)
	// A unix socket's path must be short: not under t.TempDir's long name.
	plugin, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(plugin) })
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-a-uid"}})
	lib := filepath.Join(t.TempDir(), "libtessera.so")
	if err := os.WriteFile(lib, []byte("library"), 0o644); err != nil {
		t.Fatal(err)
	}
	shimRoot := t.TempDir()
	sd, err := shim.Install(shimRoot, lib)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, ctx: ctx, client: client, inv: &staticInventory{inv: testInventory()}, plugin: plugin, shimRoot: shimRoot, pods: map[string]*v1.Pod{},
		noticeRoot: t.TempDir()}
	n.cfg = Config{Node: "node-a", CDIDir: t.TempDir(), StateDir: plugin, Inventory: n.inv, Shim: sd,
		NoticeDir: func(podUID string) string { return filepath.Join(n.noticeRoot, podUID) },
		PipeDir:   func(uuid string) string { return "/run/tessera/mps/" + uuid + "/pipe" },
		Pods: func(ns, name string) *v1.Pod {
			n.podsMu.Lock()
			defer n.podsMu.Unlock()
			return n.pods[ns+"/"+name]
		}}
	n.startDriver()
	if err := n.server.Publish(ctx, n.inv.Published(), nil); err != nil {
		t.Fatal(err)
	}
	m, err := kubeletdra.NewManager(klog.Background(), client, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	}
	if err := m.Start(ctx, func() []*v1.Pod { return nil }, getNode, neverReady{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	n.manager = m
	n.register()
	return n
}

// startDriver starts the agent's driver, as the agent does at start.
func (n *node) startDriver() {
	n.t.Helper()
	d, err := New(n.cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	s, err := Serve(n.ctx, d, ServeOptions{Client: n.client, PluginDir: n.plugin, Policy: Policy{MinMemoryMiB: 1024, MemoryOversubscription: 1}})
	if err != nil {
		n.t.Fatal(err)
	}
	n.driver, n.server = d, s
}

// register is kubelet's plugin watcher finding the socket.
func (n *node) register() {
	n.t.Helper()
	if err := n.manager.GetWatcherHandler().RegisterPlugin(n.ctx, DriverName, SocketPath(n.plugin), []string{drapbv1.DRAPluginService}, nil); err != nil {
		n.t.Fatal(err)
	}
}

// restartDriver is the agent restarting: its server gone, a new driver
// from the same directories, registered again.
func (n *node) restartDriver() {
	n.t.Helper()
	n.server.Stop()
	n.manager.GetWatcherHandler().DeRegisterPlugin(n.ctx, DriverName, SocketPath(n.plugin))
	n.startDriver()
	n.register()
}

// slices are the driver's ResourceSlices as the API has them.
func (n *node) slices() []*resourceapi.ResourceSlice {
	n.t.Helper()
	var out []*resourceapi.ResourceSlice
	err := wait.PollUntilContextTimeout(n.ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := n.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) == 0 {
			return false, nil
		}
		out = nil
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
		return true, nil
	})
	if err != nil {
		n.t.Fatalf("the driver published no ResourceSlice: %v", err)
	}
	return out
}

type classes []*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) { return c, nil }
func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, x := range c {
		if x.Name == name {
			return x, nil
		}
	}
	return nil, fmt.Errorf("no DeviceClass %s", name)
}

var gpuClass = append(classes{{ObjectMeta: metav1.ObjectMeta{Name: "tessera-gpu"}, Spec: resourceapi.DeviceClassSpec{
	Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev"`}}}}}},
	shippedClasses()...)

// shippedClasses are the chart's DeviceClasses, as the plain agent
// manifest has them.
func shippedClasses() classes {
	objs, err := deploy.Objects(deploy.Agent)
	if err != nil {
		panic(err)
	}
	var out classes
	for _, u := range objs {
		if u.GetKind() != "DeviceClass" {
			continue
		}
		var dc resourceapi.DeviceClass
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &dc); err != nil {
			panic(err)
		}
		out = append(out, &dc)
	}
	return out
}

// allocated is the state upstream's scheduler gathers from allocated
// claims: shared device IDs and the capacity they consumed.
func allocated(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	s := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	for _, c := range claims {
		for _, r := range c.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				s.AllocatedDevices.Insert(id)
				continue
			}
			s.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			s.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	return s
}

// claim is a pod's claim asking capacity (none: the whole GPU) with
// extra CEL selectors, allocated by upstream's structured allocator
// against the published slices, as kube-scheduler's DynamicResources
// would; nil when nothing fits.
func (n *node) claim(name string, capacity map[resourceapi.QualifiedName]string, selectors ...string) *resourceapi.ResourceClaim {
	return n.claimOf("tessera-gpu", name, capacity, selectors...)
}

// claimOf is claim of a given DeviceClass.
func (n *node) claimOf(class, name string, capacity map[resourceapi.QualifiedName]string, selectors ...string) *resourceapi.ResourceClaim {
	n.t.Helper()
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	if capacity != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			req.Capacity.Requests[k] = resource.MustParse(v)
		}
	}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}
	features := structured.Features{ConsumableCapacity: true, DeviceTaints: true, PartitionableDevices: true}
	a, err := structured.NewAllocator(n.ctx, features, allocated(n.claims), gpuClass, n.slices(),
		cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		n.t.Fatal(err)
	}
	k8sNode, _ := n.client.CoreV1().Nodes().Get(n.ctx, "node-a", metav1.GetOptions{})
	res, err := a.Allocate(n.ctx, k8sNode, []*resourceapi.ResourceClaim{c})
	if err != nil {
		n.t.Fatal(err)
	}
	if len(res) == 0 {
		return nil
	}
	c.Status.Allocation = &res[0]
	n.claims = append(n.claims, c)
	return c
}

// release is the claim deallocated, as the claim controller does once its
// pod is gone.
func (n *node) release(c *resourceapi.ResourceClaim) {
	n.claims = slices.DeleteFunc(n.claims, func(x *resourceapi.ResourceClaim) bool { return x.UID == c.UID })
}

// pod is a pod of tessera-scheduler holding claim c, reserved for it,
// the claim stored.
func (n *node) pod(c *resourceapi.ResourceClaim) *v1.Pod {
	n.t.Helper()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-" + c.Name, Namespace: "default", UID: types.UID("pod-uid-" + c.Name)},
		Spec: v1.PodSpec{NodeName: "node-a", SchedulerName: "tessera-scheduler", ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(c.Name)}},
			Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}}}}}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	if _, err := n.client.ResourceV1().ResourceClaims("default").Create(n.ctx, c, metav1.CreateOptions{}); err != nil {
		n.t.Fatal(err)
	}
	n.podsMu.Lock()
	n.pods[p.Namespace+"/"+p.Name] = p
	n.podsMu.Unlock()
	return p
}

// prepared is what kubelet hands the runtime for the pod's container: its
// CDI devices, and the edits of each from the spec the driver wrote.
func (n *node) prepared(p *v1.Pod) ([]string, specs.ContainerEdits) {
	n.t.Helper()
	info, err := n.manager.GetResources(p, &p.Spec.Containers[0])
	if err != nil {
		n.t.Fatal(err)
	}
	var ids []string
	var edits specs.ContainerEdits
	for _, d := range info.CDIDevices {
		ids = append(ids, d.Name)
		kind, name, _ := strings.Cut(d.Name, "=")
		if kind != CDIKind {
			n.t.Fatalf("CDI device %s is not of kind %s", d.Name, CDIKind)
		}
		b, err := os.ReadFile(SpecPath(n.cfg.CDIDir, types.UID(name)))
		if err != nil {
			n.t.Fatalf("the spec of %s: %v", d.Name, err)
		}
		var spec specs.Spec
		if err := json.Unmarshal(b, &spec); err != nil {
			n.t.Fatal(err)
		}
		if spec.Kind != CDIKind || len(spec.Devices) != 1 || spec.Devices[0].Name != name {
			n.t.Fatalf("spec of %s: %+v", d.Name, spec)
		}
		edits = spec.Devices[0].ContainerEdits
	}
	return ids, edits
}

func envOf(e specs.ContainerEdits) map[string]string {
	out := map[string]string{}
	for _, kv := range e.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// TestKubeletPreparesClaims: kubelet's own DRA manager, driving the
// agent's driver over its socket, gets for whole, MPS and time-sliced
// claims (allocated by upstream's allocator on the published slice) the
// CDI device whose spec holds exactly the capacity consumed, and the
// unprepare removes it.
func TestKubeletPreparesClaims(t *testing.T) {
	n := startNode(t)
	for _, tc := range []struct {
		name     string
		capacity map[resourceapi.QualifiedName]string
		selector string
		device   string
		env      map[string]string
		shim     string // the limits file, when the shim holds the slice
	}{
		{name: "whole", selector: `device.attributes["gpu.tessera.dev"].index == 1`, device: "gpu-1",
			env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1", "TESSERA_GPU_ISOLATION": "0:memory=device,compute=device"}},
		{name: "mps", capacity: map[resourceapi.QualifiedName]string{"memory": "10Gi", "cores": "25"}, selector: `device.attributes["gpu.tessera.dev"].sharing == "mps"`,
			device: "gpu-0", env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "TESSERA_GPU_ISOLATION": "0:memory=shim,compute=mps-client"},
			shim: "GPU-0 10737418240 25 mps\n"},
		{name: "timesliced", capacity: map[resourceapi.QualifiedName]string{"memory": "6000Mi", "cores": "30"}, selector: `device.attributes["gpu.tessera.dev"].sharing == "time-slicing"`,
			device: "gpu-1", env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1", "TESSERA_GPU_MEMORY_LIMIT_MIB": "0=6000", "TESSERA_GPU_CORES_PERCENT": "0=30",
				"TESSERA_GPU_ISOLATION": "0:memory=shim,compute=shim"},
			shim: "GPU-1 6291456000 30\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := n.claim(tc.name, tc.capacity, tc.selector)
			if c == nil {
				t.Fatal("upstream's allocator found no device")
			}
			if got := c.Status.Allocation.Devices.Results[0].Device; got != tc.device {
				t.Fatalf("allocated %s, want %s", got, tc.device)
			}
			p := n.pod(c)
			if err := n.manager.PrepareResources(n.ctx, p); err != nil {
				t.Fatal(err)
			}
			ids, edits := n.prepared(p)
			if want := []string{CDIKind + "=" + string(c.UID)}; !slices.Equal(ids, want) {
				t.Errorf("CDI devices %v, want %v", ids, want)
			}
			env := envOf(edits)
			for k, v := range tc.env {
				if env[k] != v {
					t.Errorf("%s=%q, want %q (env %v)", k, env[k], v, edits.Env)
				}
			}
			limits := filepath.Join(n.shimRoot, "claims", string(c.UID), "limits")
			b, err := os.ReadFile(limits)
			switch {
			case tc.shim == "" && err == nil:
				t.Errorf("a shim limits file for a whole GPU: %q", b)
			case tc.shim != "" && (err != nil || !strings.HasSuffix(string(b), tc.shim)):
				t.Errorf("shim limits %q (%v), want …%q", b, err, tc.shim)
			}
			if tc.shim != "" && !slices.ContainsFunc(edits.Mounts, func(m *specs.Mount) bool { return m.HostPath == limits && m.ContainerPath == shim.LimitsInContainer }) {
				t.Errorf("the limits file is not mounted: %+v", edits.Mounts)
			}
			// Preemption's notice directory of the pod the claim is
			// reserved for, where a claim holder preempted gets its notice.
			notices := filepath.Join(n.noticeRoot, string(p.UID))
			if st, err := os.Stat(notices); err != nil || !st.IsDir() ||
				!slices.ContainsFunc(edits.Mounts, func(m *specs.Mount) bool { return m.HostPath == notices && m.ContainerPath == preemption.ContainerDir }) {
				t.Errorf("the pod's notice directory is not mounted (%v): %+v", err, edits.Mounts)
			}
			if err := n.manager.UnprepareResources(n.ctx, p); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(SpecPath(n.cfg.CDIDir, c.UID)); !os.IsNotExist(err) {
				t.Errorf("the spec after unprepare: %v", err)
			}
			if _, err := os.Stat(limits); !os.IsNotExist(err) {
				t.Errorf("the shim directory after unprepare: %v", err)
			}
			if got := n.driver.Prepared(); len(got) != 0 {
				t.Errorf("claims still recorded: %v", got)
			}
			n.release(c)
		})
	}
}

// TestFiftyClaimsAtOnce: 50 pods' claims prepared concurrently through
// kubelet each get their own spec with their own capacity.
func TestFiftyClaimsAtOnce(t *testing.T) {
	n := startNode(t)
	var pods []*v1.Pod
	want := map[types.UID]string{}
	for i := range 50 {
		mem := fmt.Sprintf("%dMi", 1024+i)
		c := n.claim(fmt.Sprintf("c%02d", i), map[resourceapi.QualifiedName]string{"memory": mem, "cores": "1"}, `device.attributes["gpu.tessera.dev"].index == 1`)
		if c == nil {
			t.Fatalf("claim %d did not fit", i)
		}
		pods = append(pods, n.pod(c))
		want[c.UID] = fmt.Sprintf("0=%d", 1024+i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(pods))
	for _, p := range pods {
		wg.Go(func() { errs <- n.manager.PrepareResources(n.ctx, p) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		claim := types.UID("uid-" + strings.TrimPrefix(p.Name, "pod-"))
		ids, edits := n.prepared(p)
		if want := []string{CDIKind + "=" + string(claim)}; !slices.Equal(ids, want) {
			t.Errorf("pod %s got CDI devices %v, want its own claim's %v", p.Name, ids, want)
		}
		if got := envOf(edits)["TESSERA_GPU_MEMORY_LIMIT_MIB"]; got != want[claim] {
			t.Errorf("pod %s: memory limit %s, want its claim's %s", p.Name, got, want[claim])
		}
	}
	if got := len(n.driver.Prepared()); got != 50 {
		t.Errorf("%d claims recorded, want 50", got)
	}
}

// TestSlicesAndTaintsLimitClaims: the published slice count bounds the
// claims a GPU takes, and an unhealthy GPU's taint keeps new claims off
// it until it recovers.
func TestSlicesAndTaintsLimitClaims(t *testing.T) {
	n := startNode(t)
	small := map[resourceapi.QualifiedName]string{"memory": "1Gi", "cores": "1"}
	on0 := `device.attributes["gpu.tessera.dev"].index == 0`
	for i := range 4 {
		if n.claim(fmt.Sprintf("s%d", i), small, on0) == nil {
			t.Fatalf("claim %d of 4 did not fit GPU 0's 4 slices", i)
		}
	}
	if n.claim("s4", small, on0) != nil {
		t.Error("a fifth claim fit on GPU 0, whose adjuster allows 4")
	}
	on2 := `device.attributes["gpu.tessera.dev"].index == 2`
	if n.claim("t0", small, on2) != nil {
		t.Fatal("a claim was allocated on the unhealthy GPU 2")
	}
	// Recovery: the agent publishes GPU 2 healthy, and the taint goes.
	n.inv.mu.Lock()
	n.inv.inv.GPUs[2].Healthy = true
	n.inv.mu.Unlock()
	if err := n.server.Publish(n.ctx, n.inv.Published(), nil); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(n.ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		for _, s := range n.slices() {
			for _, d := range s.Spec.Devices {
				if d.Name == "gpu-2" && len(d.Taints) == 0 {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal("GPU 2's taint stayed after it recovered")
	}
	if n.claim("t1", small, on2) == nil {
		t.Error("the recovered GPU 2 takes no claim")
	}
}

// TestRestartLosesNothing: a claim prepared before the agent restarts is
// unprepared by the new one; a claim whose prepare was cut short (its
// record written, its files half) is finished by kubelet's retry and
// removed by an unprepare either way.
func TestRestartLosesNothing(t *testing.T) {
	n := startNode(t)
	c := n.claim("before", map[resourceapi.QualifiedName]string{"memory": "2Gi", "cores": "10"}, `device.attributes["gpu.tessera.dev"].index == 1`)
	p := n.pod(c)
	if err := n.manager.PrepareResources(n.ctx, p); err != nil {
		t.Fatal(err)
	}
	n.restartDriver()
	if got := n.driver.Prepared(); !slices.Equal(got, []types.UID{c.UID}) {
		t.Fatalf("after the restart the driver knows %v, want %s", got, c.UID)
	}
	if err := n.manager.UnprepareResources(n.ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(SpecPath(n.cfg.CDIDir, c.UID)); !os.IsNotExist(err) {
		t.Errorf("the spec survived the unprepare after a restart: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n.shimRoot, "claims", string(c.UID))); !os.IsNotExist(err) {
		t.Errorf("the shim directory survived: %v", err)
	}

	// Cut short: the CDI directory cannot be written, so the prepare
	// fails after the record and the shim directory were written.
	cut := n.claim("cut", map[resourceapi.QualifiedName]string{"memory": "2Gi", "cores": "10"}, `device.attributes["gpu.tessera.dev"].index == 1`)
	pc := n.pod(cut)
	cdi := n.cfg.CDIDir
	n.cfg.CDIDir = filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(n.cfg.CDIDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n.restartDriver()
	if err := n.manager.PrepareResources(n.ctx, pc); err == nil {
		t.Fatal("prepare succeeded without a CDI directory")
	}
	if got := n.driver.Prepared(); !slices.Equal(got, []types.UID{cut.UID}) {
		t.Fatalf("the cut-short claim is not recorded: %v", got)
	}
	n.cfg.CDIDir = cdi
	n.restartDriver()
	if err := n.manager.PrepareResources(n.ctx, pc); err != nil {
		t.Fatalf("kubelet's retry after the restart: %v", err)
	}
	if _, edits := n.prepared(pc); envOf(edits)["TESSERA_GPU_MEMORY_LIMIT_MIB"] != "0=2048" {
		t.Errorf("the retried claim's edits: %v", edits.Env)
	}
	if err := n.manager.UnprepareResources(n.ctx, pc); err != nil {
		t.Fatal(err)
	}
	if got := n.driver.Prepared(); len(got) != 0 {
		t.Errorf("claims left recorded: %v", got)
	}
}

// TestMissingCapacityFailsClosed: an allocation that does not say what it
// consumed (a scheduler without consumable capacity) is refused, and
// kubelet says why.
func TestMissingCapacityFailsClosed(t *testing.T) {
	n := startNode(t)
	c := n.claim("bare", map[resourceapi.QualifiedName]string{"memory": "2Gi", "cores": "10"})
	for i := range c.Status.Allocation.Devices.Results {
		c.Status.Allocation.Devices.Results[i].ConsumedCapacity = nil
	}
	p := n.pod(c)
	err := n.manager.PrepareResources(n.ctx, p)
	if err == nil || !strings.Contains(err.Error(), "consumed") {
		t.Fatalf("prepare of a claim without consumed capacity: %v", err)
	}
	if got := testutil.ToFloat64(n.driver.refusals.WithLabelValues("node-a", "no-capacity")); got < 1 {
		t.Errorf("tessera_dra_prepare_refusals_total{reason=no-capacity} = %v", got)
	}
	if _, err := os.Stat(SpecPath(n.cfg.CDIDir, c.UID)); !os.IsNotExist(err) {
		t.Errorf("a spec was written: %v", err)
	}
}

// TestOvercommitRefused: two allocators that each booked the same GPU
// (two schedulers with their own views) make the second claim ask more
// than the GPU has once the first is prepared: the driver, the last line
// of defense, refuses it and the first keeps its GPU; a claim over what
// the device plugin's pods hold is refused too.
func TestOvercommitRefused(t *testing.T) {
	n := startNode(t)
	on1 := `device.attributes["gpu.tessera.dev"].index == 1`
	big := map[resourceapi.QualifiedName]string{"memory": "8Gi", "cores": "60"}
	first := n.claim("first", big, on1)
	n.release(first) // the second allocator did not see it
	second := n.claim("second", big, on1)
	if first == nil || second == nil {
		t.Fatal("upstream's allocator did not place both")
	}
	p1, p2 := n.pod(first), n.pod(second)
	if err := n.manager.PrepareResources(n.ctx, p1); err != nil {
		t.Fatal(err)
	}
	err := n.manager.PrepareResources(n.ctx, p2)
	if err == nil || !strings.Contains(err.Error(), "this node cannot honour the claim's allocation") || !strings.Contains(err.Error(), "GPU-1") {
		t.Fatalf("the overcommitting claim: %v; want it refused naming the GPU", err)
	}
	if got := n.driver.Prepared(); !slices.Equal(got, []types.UID{first.UID}) {
		t.Errorf("prepared %v, want only the first claim", got)
	}
	// What an operator's rule reads.
	if got := testutil.ToFloat64(n.driver.refusals.WithLabelValues("node-a", "overcommitted")); got < 1 {
		t.Errorf("tessera_dra_prepare_refusals_total{reason=overcommitted} = %v, want at least 1", got)
	}
	if got := testutil.ToFloat64(n.driver.prepared); got != 1 {
		t.Errorf("tessera_dra_claims_prepared = %v, want 1", got)
	}

	// The device plugin's pods hold 50 % of GPU 0: a 60 % claim there is
	// refused.
	n.cfg.Booked = func() []*gpu.PodAssignment {
		return []*gpu.PodAssignment{{Node: "node-a", Containers: []gpu.ContainerAssignment{{Name: "main", Mode: gpu.ModeMPS,
			GPUs: []gpu.GPUGrant{{UUID: "GPU-0", MemoryMiB: 4096, CoresPerMille: 500}}}}}}
	}
	n.restartDriver()
	third := n.claim("third", big, `device.attributes["gpu.tessera.dev"].index == 0`)
	if err := n.manager.PrepareResources(n.ctx, n.pod(third)); err == nil || !strings.Contains(err.Error(), "cannot honour") {
		t.Fatalf("a claim over the device plugin's pods: %v; want it refused", err)
	}
}

// TestHealthReports: kubelet's health stream gets every GPU's health at
// once, and again as soon as the inventory changes (a fault).
func TestHealthReports(t *testing.T) {
	inv := &staticInventory{inv: testInventory()}
	d, err := New(Config{Node: "node-a", CDIDir: t.TempDir(), StateDir: t.TempDir(), Inventory: inv, HealthEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- d.WatchHealthStatus(ctx, reports) }()
	health := func(r kubeletplugin.DeviceHealthReport) map[string]kubeletplugin.HealthStatus {
		out := map[string]kubeletplugin.HealthStatus{}
		for _, h := range r.Devices {
			if h.PoolName != "node-a" || h.HealthCheckTimeout != 3*time.Hour {
				t.Errorf("report %+v: want pool node-a and a timeout of three report periods", h)
			}
			out[h.DeviceName] = h.Health
		}
		return out
	}
	if got := health(<-reports); got["gpu-0"] != kubeletplugin.HealthStatusHealthy || got["gpu-2"] != kubeletplugin.HealthStatusUnhealthy || len(got) != 3 {
		t.Errorf("first report %v", got)
	}
	inv.mu.Lock()
	changed := testInventory()
	changed.GPUs[0].Healthy = false
	inv.inv = changed
	inv.mu.Unlock()
	d.InventoryChanged()
	select {
	case r := <-reports:
		if got := health(r); got["gpu-0"] != kubeletplugin.HealthStatusUnhealthy {
			t.Errorf("after the fault: %v", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no report after the inventory changed (the next periodic one is an hour away)")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealthStatus: %v", err)
	}
}

// TestPodThatWouldLeaveItsSlice: a claim reserved for a privileged pod is
// not prepared (admission cannot see which driver a claim names; the node
// can), and kubelet says why; nor is one for a pod the agent does not know.
func TestPodThatWouldLeaveItsSlice(t *testing.T) {
	n := startNode(t)
	c := n.claim("escape", map[resourceapi.QualifiedName]string{"memory": "2Gi", "cores": "10"})
	p := n.pod(c)
	p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr.To(true)}
	err := n.manager.PrepareResources(n.ctx, p)
	if err == nil || !strings.Contains(err.Error(), "could leave its GPU slice") || !strings.Contains(err.Error(), "container main is privileged") {
		t.Fatalf("a privileged pod's claim: %v; want it refused naming why", err)
	}
	if got := testutil.ToFloat64(n.driver.refusals.WithLabelValues("node-a", "pod-leaves-slice")); got < 1 {
		t.Errorf("tessera_dra_prepare_refusals_total{reason=pod-leaves-slice} = %v", got)
	}
	if _, err := os.Stat(SpecPath(n.cfg.CDIDir, c.UID)); !os.IsNotExist(err) {
		t.Errorf("a spec was written: %v", err)
	}
	unknown := n.claim("unknown", map[resourceapi.QualifiedName]string{"memory": "2Gi", "cores": "10"})
	q := n.pod(unknown)
	n.podsMu.Lock()
	delete(n.pods, q.Namespace+"/"+q.Name)
	n.podsMu.Unlock()
	if err := n.manager.PrepareResources(n.ctx, q); err == nil || !strings.Contains(err.Error(), "not known to this node's agent yet") {
		t.Fatalf("a pod the agent does not know: %v", err)
	}
}

// TestPodOfAnotherScheduler: a claim reserved for a pod that names a
// scheduler without TesseraGPU is refused, saying which to name: another
// allocator chose its GPU from its own view.
func TestPodOfAnotherScheduler(t *testing.T) {
	n := startNode(t)
	c := n.claim("elsewhere", map[resourceapi.QualifiedName]string{"memory": "2Gi", "cores": "10"})
	p := n.pod(c)
	n.podsMu.Lock()
	p.Spec.SchedulerName = "default-scheduler"
	n.podsMu.Unlock()
	err := n.manager.PrepareResources(n.ctx, p)
	if err == nil || !strings.Contains(err.Error(), `names spec.schedulerName "default-scheduler"; set it to tessera-scheduler`) {
		t.Fatalf("a default-scheduler pod's claim: %v; want it refused naming the scheduler to use", err)
	}
	if got := testutil.ToFloat64(n.driver.refusals.WithLabelValues("node-a", "not-tessera-scheduled")); got != 1 {
		t.Errorf("tessera_dra_prepare_refusals_total{reason=not-tessera-scheduled} = %v, want 1", got)
	}
	if _, err := os.Stat(SpecPath(n.cfg.CDIDir, c.UID)); !os.IsNotExist(err) {
		t.Errorf("a spec was written: %v", err)
	}
}

// TestWholeClass: the shipped whole.gpu.tessera.dev class carries the
// driver's configuration; a claim of it that asks no capacity gets a
// whole GPU, one that asks a slice is refused when prepared, and a
// configuration the driver does not know is refused too.
func TestWholeClass(t *testing.T) {
	n := startNode(t)
	on1 := `device.attributes["gpu.tessera.dev"].index == 1`
	whole := n.claimOf("whole.gpu.tessera.dev", "whole", nil, on1)
	if whole == nil || len(whole.Status.Allocation.Devices.Config) != 1 {
		t.Fatalf("the whole class's claim: %+v; want it allocated with the class's configuration", whole)
	}
	p := n.pod(whole)
	if err := n.manager.PrepareResources(n.ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, edits := n.prepared(p); envOf(edits)["TESSERA_GPU_ISOLATION"] != "0:memory=device,compute=device" {
		t.Errorf("the whole claim's edits: %v", edits.Env)
	}
	if err := n.manager.UnprepareResources(n.ctx, p); err != nil {
		t.Fatal(err)
	}
	n.release(whole)

	slice := n.claimOf("whole.gpu.tessera.dev", "slice", map[resourceapi.QualifiedName]string{"memory": "8Gi", "cores": "25"}, on1)
	err := n.manager.PrepareResources(n.ctx, n.pod(slice))
	if err == nil || !strings.Contains(err.Error(), "class asks for whole GPUs, but it consumed 25 % of gpu-1's cores") {
		t.Fatalf("a slice in the whole class: %v; want it refused", err)
	}
	n.release(slice)

	odd := n.claim("odd", map[resourceapi.QualifiedName]string{"memory": "8Gi", "cores": "25"}, on1)
	odd.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName,
			Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GPUConfig","exclusive":true}`)}}}}}
	if err := n.manager.PrepareResources(n.ctx, n.pod(odd)); err == nil || !strings.Contains(err.Error(), `unknown field "exclusive"`) {
		t.Fatalf("an unknown configuration field: %v; want it refused", err)
	}
}

// TestClaimWaitsForAReclaim: a claim on a GPU that a preempted pod's
// leftover processes may still hold is not prepared (reason reclaiming,
// naming the victim, no file written) until the reclaim is done; then
// kubelet's retry prepares it.
func TestClaimWaitsForAReclaim(t *testing.T) {
	n := startNode(t)
	busy := true
	n.driver.cfg.Reclaiming = func(gpus []string) (string, bool) { return "ml/victim", busy && len(gpus) == 1 }
	c := n.claim("after", map[resourceapi.QualifiedName]string{"memory": "2Gi", "cores": "10"})
	p := n.pod(c)
	err := n.manager.PrepareResources(n.ctx, p)
	if err == nil || !strings.Contains(err.Error(), "its GPU is still being reclaimed from a preempted pod: ml/victim may have left processes there") {
		t.Fatalf("a claim on a GPU being reclaimed: %v", err)
	}
	if got := testutil.ToFloat64(n.driver.refusals.WithLabelValues("node-a", "reclaiming")); got != 1 {
		t.Errorf("tessera_dra_prepare_refusals_total{reason=reclaiming} = %v, want 1", got)
	}
	if _, err := os.Stat(SpecPath(n.cfg.CDIDir, c.UID)); !os.IsNotExist(err) {
		t.Errorf("a spec was written: %v", err)
	}
	busy = false
	if err := n.manager.PrepareResources(n.ctx, p); err != nil {
		t.Fatalf("kubelet's retry once reclaimed: %v", err)
	}
}
