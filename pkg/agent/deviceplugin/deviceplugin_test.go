package deviceplugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/tessera-gpu/tessera/internal/privatemount"
	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

const node = "node-a"

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

// kubelet is the real device manager of kubelet, on its fixed socket, with
// the pods it has admitted.
type kubelet struct {
	t   testing.TB
	m   *devicemanager.ManagerImpl
	mu  sync.Mutex
	pod map[types.UID]*v1.Pod
}

func startKubelet(t testing.TB, logger klog.Logger) *kubelet {
	t.Helper()
	m, err := devicemanager.NewManagerImpl(logger, nil, topologymanager.NewFakeManager(logger))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{t: t, m: m, pod: map[types.UID]*v1.Pod{}}
	if err := m.Start(logger, k.activePods, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *kubelet) activePods() []*v1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []*v1.Pod
	for _, p := range k.pod {
		out = append(out, p)
	}
	return out
}

func (k *kubelet) admit(p *v1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pod[p.UID] = p
}

func (k *kubelet) get(ns, name string) *v1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.pod {
		if p.Namespace == ns && p.Name == name {
			return p
		}
	}
	return nil
}

// HolderOf answers from the device manager's records, exactly as kubelet's
// pod-resources server does (for each active pod and container,
// GetDevices).
func (k *kubelet) HolderOf(_ context.Context, res string, ids []string) (string, string, string, error) {
	want := slices.Clone(ids)
	sort.Strings(want)
	for _, p := range k.activePods() {
		for _, c := range p.Spec.Containers {
			var got []string
			for id := range k.m.GetDevices(string(p.UID), c.Name)[res] {
				got = append(got, id)
			}
			sort.Strings(got)
			if slices.Equal(got, want) {
				return p.Namespace, p.Name, c.Name, nil
			}
		}
	}
	return "", "", "", fmt.Errorf("no container holds %v", ids)
}

func (k *kubelet) Held(_ context.Context, res string) (map[string]bool, error) {
	held := map[string]bool{}
	for _, p := range k.activePods() {
		for _, c := range p.Spec.Containers {
			for id := range k.m.GetDevices(string(p.UID), c.Name)[res] {
				held[id] = true
			}
		}
	}
	return held, nil
}

func (k *kubelet) allocatable() int64 { return k.allocatableOf(deviceplugin.ResourceName) }

func (k *kubelet) allocatableOf(res string) int64 {
	_, alloc, _ := k.m.GetCapacity(klog.Background())
	q := alloc[v1.ResourceName(res)]
	return q.Value()
}

func (k *kubelet) waitAllocatable(want int64) { k.waitAllocatableOf(deviceplugin.ResourceName, want) }

func (k *kubelet) waitAllocatableOf(res string, want int64) {
	k.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for k.allocatableOf(res) != want {
		if time.Now().After(deadline) {
			k.t.Fatalf("kubelet sees %d %s allocatable, want %d", k.allocatableOf(res), res, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// forget drops a pod from kubelet's active pods; the device manager frees
// its devices at its next allocation.
func (k *kubelet) forget(uid types.UID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.pod, uid)
}

func gpus(healthy func(i int) bool) []deviceplugin.GPUSlots {
	var out []deviceplugin.GPUSlots
	for i := range 8 {
		out = append(out, deviceplugin.GPUSlots{UUID: fmt.Sprintf("GPU-%d", i), Slices: 8, Healthy: healthy(i)})
	}
	return out
}

func gpuPod(t testing.TB, i int, a *gpu.PodAssignment) *v1.Pod {
	t.Helper()
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p%02d", i), UID: types.UID(fmt.Sprintf("uid-%02d", i)), Annotations: map[string]string{}},
		Spec: v1.PodSpec{NodeName: node, SchedulerName: "tessera-scheduler", Containers: []v1.Container{{Name: "main", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{v1.ResourceName(deviceplugin.ResourceName): *resource.NewQuantity(int64(len(a.Containers[0].GPUs)), resource.DecimalSI)}}}}},
	}
	if a != nil {
		enc, err := gpu.EncodeAssignment(a)
		if err != nil {
			t.Fatal(err)
		}
		p.Annotations[gpu.AnnotationAssignment] = enc
	}
	return p
}

// assignment i of 50: MPS quarter slices, time-sliced eighths, whole GPUs and
// a few two-GPU containers.
func assignment(i int) *gpu.PodAssignment {
	c := gpu.ContainerAssignment{Name: "main"}
	switch {
	case i%10 == 9:
		c.Mode = gpu.ModeExclusive
		c.GPUs = []gpu.GPUGrant{{UUID: "GPU-6", Index: 6, MemoryMiB: 81920, CoresPerMille: 1000}, {UUID: "GPU-7", Index: 7, MemoryMiB: 81920, CoresPerMille: 1000}}
	case i%2 == 0:
		g := i % 4
		c.Mode = gpu.ModeMPS
		c.GPUs = []gpu.GPUGrant{{UUID: fmt.Sprintf("GPU-%d", g), Index: g, MemoryMiB: 4096 + int64(i), CoresPerMille: 50 + 10*(i%5)}}
	default:
		g := 4 + i%2
		c.Mode = gpu.ModeTimeSlicing
		c.GPUs = []gpu.GPUGrant{{UUID: fmt.Sprintf("GPU-%d", g), Index: g, MemoryMiB: 8192, CoresPerMille: 100}}
	}
	return &gpu.PodAssignment{Node: node, Containers: []gpu.ContainerAssignment{c}}
}

func readSpec(t *testing.T, dir string, ids []string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(deviceplugin.SpecPath(dir, ids[0]))
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

func envOf(spec map[string]any) []string {
	dev := spec["devices"].([]any)[0].(map[string]any)
	var env []string
	for _, e := range dev["containerEdits"].(map[string]any)["env"].([]any) {
		env = append(env, e.(string))
	}
	return env
}

// TestMain runs the package's tests in a private mount namespace with an empty
// tmpfs on kubelet's device-plugin directory, where kubelet's device manager
// insists on listening: the tests use kubelet's real paths and never touch the
// host's.
func TestMain(m *testing.M) {
	// CDI's spec directory too: a test that forgot its scratch CDIDir must
	// not write slot specs where the node's runtime reads them.
	privatemount.Main(m, pluginapi.DevicePluginPath, "/var/run/cdi")
}

// kubeletDir is kubelet's device-plugin directory, private to this test
// binary; it skips tb where no private mount namespace could be made.
func kubeletDir(tb testing.TB) string {
	tb.Helper()
	if err := privatemount.Err(); err != nil {
		tb.Skip(err)
	}
	return pluginapi.DevicePluginPath
}

// TestWithKubeletDeviceManager runs the plugin against kubelet's own device
// manager, in process, on kubelet's real socket: registration, ListAndWatch
// and health, 50 pods allocated at once each getting exactly its assignment,
// a container no assignment covers, kubelet's restart and the agent's.
func TestWithKubeletDeviceManager(t *testing.T) {
	dir := kubeletDir(t)
	logger, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	k := startKubelet(t, logger)
	defer func() { _ = k.m.Stop(logger) }()
	cdi := t.TempDir()
	newPlugin := func() (*deviceplugin.Plugin, context.CancelFunc) {
		p := deviceplugin.New(deviceplugin.Config{Node: node, Holder: k, Pods: k.get, CDIDir: cdi,
			PipeDir: func(uuid string) string { return "/run/tessera/mps/" + uuid + "/pipe" }})
		p.SetGPUs(gpus(func(int) bool { return true }))
		pctx, pcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = p.Run(pctx, dir, 50*time.Millisecond) }()
		return p, func() { pcancel(); <-done }
	}
	plugin, stopPlugin := newPlugin()

	// Registration and ListAndWatch: 8 GPUs × 8 slots.
	start := time.Now()
	k.waitAllocatable(64)
	t.Logf("registered and advertised in %v", time.Since(start).Round(time.Millisecond))

	// A fault on GPU 3 turns its 8 slots unhealthy at once.
	plugin.SetGPUs(gpus(func(i int) bool { return i != 3 }))
	k.waitAllocatable(56)
	plugin.SetGPUs(gpus(func(int) bool { return true }))
	k.waitAllocatable(64)

	// 50 pods bound at once. Kubelet admits pods one by one (Allocate is
	// not safe to call concurrently, and kubelet never does), and then its
	// pod workers start their containers in parallel: all 50 hold slots
	// before any container starts, the case where guessing which pod an
	// Allocate was for goes wrong.
	pods := make([]*v1.Pod, 50)
	lat := make([]time.Duration, len(pods))
	for i := range pods {
		pods[i] = gpuPod(t, i, assignment(i))
		k.admit(pods[i])
		t0 := time.Now()
		if err := k.m.Allocate(ctx, pods[i], &pods[i].Spec.Containers[0], lifecycle.AddOperation); err != nil {
			t.Fatalf("%s: Allocate: %v", pods[i].Name, err)
		}
		lat[i] = time.Since(t0)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(pods))
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts, err := k.m.GetDeviceRunContainerOptions(ctx, p, &p.Spec.Containers[0])
			if err != nil {
				errs <- fmt.Errorf("%s: run options (PreStartContainer): %w", p.Name, err)
				return
			}
			if len(opts.CDIDevices) != len(assignment(i).Containers[0].GPUs) {
				errs <- fmt.Errorf("%s: %d CDI devices", p.Name, len(opts.CDIDevices))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	slices.Sort(lat)
	t.Logf("Allocate through the device manager: p50 %v, p99 %v over %d pods", lat[len(lat)/2], lat[len(lat)*99/100], len(lat))

	// Each container's CDI spec carries exactly its own assignment.
	seen := map[string]string{}
	for i, p := range pods {
		var ids []string
		for id := range k.m.GetDevices(string(p.UID), "main")[deviceplugin.ResourceName] {
			if other, dup := seen[id]; dup {
				t.Fatalf("slot %s handed to %s and %s", id, other, p.Name)
			}
			seen[id] = p.Name
			ids = append(ids, id)
		}
		spec := readSpec(t, cdi, ids)
		if spec["kind"] != deviceplugin.CDIKind {
			t.Fatalf("%s: spec kind %v", p.Name, spec["kind"])
		}
		want, err := deviceplugin.EditsFor(assignment(i).Containers[0], func(uuid string) string { return "/run/tessera/mps/" + uuid + "/pipe" })
		if err != nil {
			t.Fatal(err)
		}
		if got := envOf(spec); !slices.Equal(got, want.Env) {
			t.Errorf("%s: env %v, want %v", p.Name, got, want.Env)
		}
		a := assignment(i).Containers[0]
		if a.Mode == gpu.ModeMPS {
			g := a.GPUs[0]
			for _, w := range []string{fmt.Sprintf("NVIDIA_VISIBLE_DEVICES=%s", g.UUID), fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", (g.CoresPerMille+9)/10),
				fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", g.MemoryMiB)} {
				if !slices.Contains(envOf(spec), w) {
					t.Errorf("%s: env lacks %s", p.Name, w)
				}
			}
		}
	}

	// p00 leaves: its spec is collected, the others stay. The specs are
	// made older than kubelet's record first: one written after the record
	// was read is a container being started, and stays for the next pass.
	k.mu.Lock()
	delete(k.pod, pods[0].UID)
	k.mu.Unlock()
	if n, err := plugin.CollectSpecs(ctx); err != nil || n != 0 {
		t.Fatalf("CollectSpecs removed %d fresh spec(s), %v; want none yet", n, err)
	}
	specs, _ := filepath.Glob(filepath.Join(cdi, "*.json"))
	for _, f := range specs {
		old := time.Now().Add(-time.Minute)
		if err := os.Chtimes(f, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := plugin.CollectSpecs(ctx); err != nil || n != 1 {
		t.Fatalf("CollectSpecs removed %d, %v; want p00's one spec", n, err)
	}
	k.admit(pods[0])

	// A pod no assignment covers (not placed by tessera-scheduler) gets its
	// slots from kubelet but never starts: the error is what kubelet shows.
	stray := gpuPod(t, 99, assignment(0))
	delete(stray.Annotations, gpu.AnnotationAssignment)
	k.admit(stray)
	if err := k.m.Allocate(ctx, stray, &stray.Spec.Containers[0], lifecycle.AddOperation); err != nil {
		t.Fatal(err)
	}
	if _, err := k.m.GetDeviceRunContainerOptions(ctx, stray, &stray.Spec.Containers[0]); err == nil || !strings.Contains(err.Error(), "no Tessera GPU assignment") {
		t.Fatalf("stray pod: %v, want a refusal naming the missing assignment", err)
	}
	// An assignment on a pod no Tessera profile scheduled is not honoured,
	// whoever wrote it: the refusal names the scheduler.
	other := gpuPod(t, 98, assignment(1))
	other.Spec.SchedulerName = "default-scheduler"
	k.admit(other)
	if err := k.m.Allocate(ctx, other, &other.Spec.Containers[0], lifecycle.AddOperation); err != nil {
		t.Fatal(err)
	}
	if _, err := k.m.GetDeviceRunContainerOptions(ctx, other, &other.Spec.Containers[0]); err == nil ||
		!strings.Contains(err.Error(), `names spec.schedulerName "default-scheduler", not one of tessera-scheduler`) ||
		!strings.Contains(err.Error(), deviceplugin.ErrNotTesseraScheduled.Error()) {
		t.Fatalf("pod of another scheduler: %v, want a refusal naming its scheduler", err)
	}

	// Kubelet restarts: a new device manager on a new socket. The plugin
	// registers again on its own.
	if err := k.m.Stop(logger); err != nil {
		t.Fatal(err)
	}
	k2 := startKubelet(t, logger)
	defer func() { _ = k2.m.Stop(logger) }()
	k2.pod = k.pod
	start = time.Now()
	k2.waitAllocatable(64)
	t.Logf("re-registered %v after kubelet restarted", time.Since(start).Round(time.Millisecond))
	// Kubelet's checkpoint kept the 50 pods' slots.
	if got := len(k2.m.GetDevices(string(pods[0].UID), "main")[deviceplugin.ResourceName]); got != 1 {
		t.Fatalf("after kubelet's restart pod p00 holds %d slots", got)
	}

	// The agent restarts: the new plugin process serves again and kubelet's
	// records still name every holder.
	stopPlugin()
	start = time.Now()
	_, stopPlugin = newPlugin()
	defer stopPlugin()
	p := pods[1]
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := k2.m.GetDeviceRunContainerOptions(ctx, p, &p.Spec.Containers[0])
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the agent restarted: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("containers start again %v after the agent restarted", time.Since(start).Round(time.Millisecond))
	k2.waitAllocatable(64)
}
