// Package e2e drives the playground `tessera up` runs: the real control
// plane, tessera-scheduler, and simulated nodes running the real agent behind
// kubelet's own device-plugin and pod-resources servers.
package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/isolation"
	"github.com/tessera-gpu/tessera/pkg/agent/mps/mpssim"
	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
	"github.com/tessera-gpu/tessera/pkg/top"
)

// TestMain lets this test binary stand in for nvidia-cuda-mps-control, as
// the tessera binary does for `tessera up`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "mps-control" {
		os.Exit(mpssim.Main(os.Args[:2], os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func up(t *testing.T, opts playground.Options) (*playground.Cluster, time.Time) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a whole playground; skipped with -short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts.MPSControl = []string{exe, "mps-control"}
	start := time.Now()
	c, err := playground.Up(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Down)
	t.Logf("playground up in %v", time.Since(start).Round(time.Millisecond))
	return c, start
}

// waitRunning waits for the pods to run and returns them.
func waitRunning(t *testing.T, client kubernetes.Interface, ns string, names []string, timeout time.Duration) map[string]*v1.Pod {
	t.Helper()
	out := map[string]*v1.Pod{}
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			if _, ok := out[n]; ok {
				continue
			}
			p, err := client.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
			if err == nil && p.Status.Phase == v1.PodRunning {
				out[n] = p
			}
		}
		return len(out) == len(names), nil
	})
	if err != nil {
		var missing []string
		for _, n := range names {
			if _, ok := out[n]; !ok {
				p, _ := client.CoreV1().Pods(ns).Get(context.Background(), n, metav1.GetOptions{})
				missing = append(missing, fmt.Sprintf("%s (%v)", n, p.Status))
			}
		}
		t.Fatalf("not Running after %v: %v", timeout, missing)
	}
	return out
}

// held asks a node's kubelet pod-resources API which slots each container
// of each pod holds.
func held(t *testing.T, socket string) map[string][]string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(context.Background(), &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == gpu.ResourceGPU {
					out[p.GetNamespace()+"/"+p.GetName()+"/"+c.GetName()] = d.GetDeviceIds()
				}
			}
		}
	}
	return out
}

// specEnv reads the CDI spec the agent wrote for a container's slots and
// returns its environment.
func specEnv(t *testing.T, cdiDir string, slots []string) map[string]string {
	t.Helper()
	env, _ := specEdits(t, cdiDir, slots)
	return env
}

// specEdits reads the CDI specs the agent wrote for a container's slots (one
// file per slot, each defining just its slot, all with the container's
// edits) and returns their environment and mounts (container path → host
// path).
func specEdits(t *testing.T, cdiDir string, slots []string) (map[string]string, map[string]string) {
	t.Helper()
	var env, mounts map[string]string
	for _, slot := range slots {
		b, err := os.ReadFile(deviceplugin.SpecPath(cdiDir, slot))
		if err != nil {
			t.Fatalf("CDI spec of %s: %v", slot, err)
		}
		var spec struct {
			Devices []struct {
				Name           string `json:"name"`
				ContainerEdits struct {
					Env    []string `json:"env"`
					Mounts []struct {
						HostPath      string `json:"hostPath"`
						ContainerPath string `json:"containerPath"`
					} `json:"mounts"`
				} `json:"containerEdits"`
			} `json:"devices"`
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		if len(spec.Devices) != 1 || spec.Devices[0].Name != slot {
			t.Fatalf("CDI spec of %s defines %d devices", slot, len(spec.Devices))
		}
		e, m := map[string]string{}, map[string]string{}
		for _, kv := range spec.Devices[0].ContainerEdits.Env {
			k, v, _ := strings.Cut(kv, "=")
			e[k] = v
		}
		for _, mt := range spec.Devices[0].ContainerEdits.Mounts {
			m[mt.ContainerPath] = mt.HostPath
		}
		if env != nil && (!maps.Equal(env, e) || !maps.Equal(mounts, m)) {
			t.Fatalf("the slots of one container carry different edits: %v %v", env, e)
		}
		env, mounts = e, m
	}
	return env, mounts
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// The scheduler serves a self-signed certificate.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // test of a local endpoint
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// TestPlayground: pods of every mode land where the scheduler put them and
// run with exactly their assignment, through kubelet's own device-plugin
// calls; the kubeconfig written works; both metrics endpoints serve; a pod
// the scheduler did not place is refused its GPUs with a reason on the pod;
// a deleted pod's slots are released; and Down leaves nothing behind.
func TestPlayground(t *testing.T) {
	// A driver with kernel memory limits (newer than R580), so both the
	// kernel's limit and libtessera are in force on time-sliced slices.
	c, start := up(t, playground.Options{Nodes: 3, GPUsPerNode: 4, Model: "a100", MPSNodes: 1, RefusedGrace: refusedGrace, DriverKernelLimits: true})

	// The kubeconfig is what a user gets.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	// Each phase builds on the ones before it: the first to fail ends the
	// test.
	phase := func(name string, f func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	byNode := map[string]*playground.Node{}
	for _, n := range c.Nodes {
		byNode[n.Name] = n
	}
	const ns = "e2e"
	var (
		pods  map[string]*v1.Pod
		tsPod *v1.Pod
		tsAsg *gpu.PodAssignment
		tsGPU string
	)

	phase("nodes through the kubeconfig", func(t *testing.T) {
		nodes, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil || len(nodes.Items) != 3 {
			t.Fatalf("nodes through the kubeconfig: %d, %v", len(nodes.Items), err)
		}
		for _, n := range nodes.Items {
			// 4 GPUs × 8 slices, as kubelet reports the plugin's devices.
			if q := n.Status.Allocatable[gpu.ResourceGPU]; q.Value() != 32 {
				t.Errorf("node %s allocatable %s = %s, want 32", n.Name, gpu.ResourceGPU, q.String())
			}
		}
	})

	phase("four pods placed with their CDI specs", func(t *testing.T) {
		specs := []playground.PodSpec{
			{Name: "whole", GPUs: 1, Sharing: gpu.ModeExclusive, PriorityClass: "gpu-standard"},
			{Name: "pair", GPUs: 2, Sharing: gpu.ModeExclusive, PriorityClass: "gpu-standard"},
			{Name: "mps", GPUs: 1, MemoryMiB: 10240, Cores: 30, Sharing: gpu.ModeMPS, Workload: gpu.WorkloadInference, PriorityClass: "gpu-critical"},
			{Name: "ts", GPUs: 1, MemoryMiB: 16384, Cores: 40, Sharing: gpu.ModeTimeSlicing, Workload: gpu.WorkloadInference, PriorityClass: "gpu-batch"},
		}
		if err := playground.Submit(context.Background(), client, ns, specs); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range specs {
			names = append(names, s.Name)
		}
		pods = waitRunning(t, client, ns, names, 30*time.Second)
		// Logged, not asserted: this machine's load decides it.
		t.Logf("first pods Running %v after Up began", time.Since(start).Round(time.Millisecond))
		for _, s := range specs {
			p := pods[s.Name]
			a, err := podgpu.BoundAssignment(p)
			if err != nil || a == nil {
				t.Fatalf("%s: assignment %v, %v", s.Name, a, err)
			}
			n := byNode[p.Spec.NodeName]
			if got := a.Containers[0].Mode; got != s.Sharing {
				t.Errorf("%s runs %s, want %s", s.Name, got, s.Sharing)
			}
			if s.Sharing == gpu.ModeMPS && !n.MPS || s.Sharing == gpu.ModeTimeSlicing && n.MPS {
				t.Errorf("%s (%s) landed on %s (MPS %v)", s.Name, s.Sharing, n.Name, n.MPS)
			}
			// Kubelet's record of the container's slots, and the CDI spec the
			// agent wrote for them from the assignment.
			slots := held(t, n.PodResourcesSocket)[ns+"/"+s.Name+"/main"]
			if len(slots) != s.GPUs {
				t.Fatalf("%s holds slots %v, want %d", s.Name, slots, s.GPUs)
			}
			env, mounts := specEdits(t, n.CDIDir, slots)
			// Every GPU container gets its pod's preemption notice directory.
			if h := mounts[preemption.ContainerDir]; !strings.HasSuffix(h, string(p.UID)) {
				t.Errorf("%s: preemption notice mount %q", s.Name, h)
			}
			var uuids []string
			for _, g := range a.Containers[0].GPUs {
				uuids = append(uuids, g.UUID)
			}
			if env["NVIDIA_VISIBLE_DEVICES"] != strings.Join(uuids, ",") {
				t.Errorf("%s sees %q, assigned %v", s.Name, env["NVIDIA_VISIBLE_DEVICES"], uuids)
			}
			if s.Sharing == gpu.ModeMPS {
				if env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "30" || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=10240M" {
					t.Errorf("MPS client limits %v", env)
				}
			}
		}

	})

	phase("MPS daemons given their defaults", func(t *testing.T) {
		// Every MPS-mode GPU has its daemon, given its defaults.
		for _, n := range c.Nodes {
			logs, _ := filepath.Glob(filepath.Join(n.MPSRoot, "*", "log", "control.log"))
			if n.MPS && len(logs) != 4 || !n.MPS && len(logs) != 0 {
				t.Errorf("node %s (MPS %v) has %d MPS daemon logs", n.Name, n.MPS, len(logs))
			}
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				if !strings.Contains(string(b), "set_default_active_thread_percentage 100") {
					t.Errorf("%s: daemon not given its defaults: %q", l, b)
				}
			}
		}

	})

	phase("time-slice classes", func(t *testing.T) {
		// Time-shared GPUs have the driver's time-slice class for their
		// tenants: the inference pod's GPU the IO-bound one (medium), every
		// other the compute-bound one (long); MPS GPUs none.
		tsPod = pods["ts"]
		var err error
		tsAsg, err = podgpu.BoundAssignment(tsPod)
		if err != nil || tsAsg == nil {
			t.Fatalf("ts: assignment %v, %v", tsAsg, err)
		}
		tsGPU = tsAsg.Containers[0].GPUs[0].UUID
		err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			cl, _ := byNode[tsPod.Spec.NodeName].TimeSlices.Get(tsGPU)
			return cl == timeslice.Medium, nil
		})
		if err != nil {
			cl, ok := byNode[tsPod.Spec.NodeName].TimeSlices.Get(tsGPU)
			t.Errorf("time-sliced inference pod's GPU has class %v (set %v), want medium", cl, ok)
		}
		for _, n := range c.Nodes {
			for i, d := range n.NVML.Devices {
				uuid, _ := d.GetUUID()
				cl, ok := n.TimeSlices.Get(uuid)
				switch {
				case n.MPS && ok:
					t.Errorf("%s GPU %d is MPS, yet given time-slice class %v", n.Name, i, cl)
				case !n.MPS && uuid != tsGPU && cl != timeslice.Long:
					t.Errorf("%s GPU %d: time-slice class %v (set %v), want long", n.Name, i, cl, ok)
				}
			}
		}

	})

	phase("isolation in force", func(t *testing.T) {
		// Isolation in force (the playground's mock driver offers kernel
		// memory limits on every GPU): the time-sliced pod's cgroup is held to
		// its grant, set in PreStartContainer, before kubelet reported the pod
		// Running, and its container gets libtessera for its SM share; each
		// pod says what holds its slices.
		tsNode0 := byNode[tsPod.Spec.NodeName]
		if hard, ok := tsNode0.MemoryLimit(tsAsg.Containers[0].GPUs[0].Index, tsPod.UID); !ok || hard != 16384<<20 {
			t.Errorf("ts pod's kernel GPU memory limit: %d bytes (set %v), want its 16384 MiB grant", hard, ok)
		}
		limitsPath := filepath.Join(tsNode0.ShimRoot, "pods", string(tsPod.UID), "main", "limits")
		if b, err := os.ReadFile(limitsPath); err != nil || !strings.Contains(string(b), fmt.Sprintf("%s %d %d\n", tsGPU, int64(16384)<<20, tsAsg.Containers[0].GPUs[0].CoresPercent())) {
			t.Errorf("ts pod's libtessera limits %q (%v), want its grant on %s", b, err, tsGPU)
		}
		specs, _ := filepath.Glob(filepath.Join(tsNode0.CDIDir, "*.json"))
		preloaded := false
		for _, path := range specs {
			if b, _ := os.ReadFile(path); strings.Contains(string(b), limitsPath) && strings.Contains(string(b), `"/etc/ld.so.preload"`) {
				preloaded = true
			}
		}
		if !preloaded {
			t.Errorf("no CDI spec in %s mounts the ts pod's limits and /etc/ld.so.preload", tsNode0.CDIDir)
		}
		for _, name := range []string{"mps", "whole"} {
			p := pods[name]
			if _, err := os.Stat(filepath.Join(byNode[p.Spec.NodeName].ShimRoot, "pods", string(p.UID))); !os.IsNotExist(err) {
				t.Errorf("%s pod, held without libtessera, has a libtessera directory (%v)", name, err)
			}
		}
		for name, want := range map[string]string{
			"ts":    "main on " + tsGPU + ": memory=kernel,compute=shim",
			"mps":   ": memory=mps-server,compute=mps-server", // alone on its GPU: the server is held to its grant
			"whole": ": memory=device,compute=device",
		} {
			err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
				p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				for _, c := range p.Status.Conditions {
					if c.Type == isolation.ConditionGPUIsolation && strings.Contains(c.Message, want) {
						return true, nil
					}
				}
				return false, nil
			})
			if err != nil {
				p, _ := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
				t.Errorf("%s: no %s condition saying %q: %+v", name, isolation.ConditionGPUIsolation, want, p.Status.Conditions)
			}
		}

	})

	phase("metrics and top", func(t *testing.T) {
		// Metrics: the scheduler's, and the agents' per tenant.
		if body := scrape(t, c.SchedulerMetricsURL); !strings.Contains(body, "tessera_scheduler_gpu_allocated_slices") {
			t.Error("scheduler metrics lack tessera_scheduler_gpu_allocated_slices")
		}
		mpsPod := pods["mps"]
		agentURL := byNode[mpsPod.Spec.NodeName].MetricsURL
		err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return strings.Contains(scrape(t, agentURL), `tessera_container_gpu_memory_used_bytes{UUID="`) && strings.Contains(scrape(t, agentURL), `,container="main",gpu="`), nil
		})
		if err != nil {
			t.Errorf("agent %s shows no per-tenant series", agentURL)
		}
		snap, err := top.Collect(context.Background(), client)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			if err := snap.AddUsage(context.Background(), n.MetricsURL); err != nil {
				t.Fatal(err)
			}
		}
		live := 0
		for _, g := range snap.GPUs {
			for _, tn := range g.Tenants {
				if tn.Live {
					live++
					if tn.UsedMiB <= 0 || tn.UsedMiB > tn.MemoryMiB {
						t.Errorf("%s/%s uses %d MiB of %d granted", tn.Namespace, tn.Pod, tn.UsedMiB, tn.MemoryMiB)
					}
				}
			}
		}
		// whole, pair ×2, mps, ts.
		if live != 5 {
			var sb strings.Builder
			_ = top.Render(&sb, snap)
			t.Errorf("%d tenants with live usage, want 5:\n%s", live, sb.String())
		}

	})

	phase("admission guards and the agent's refusals", func(t *testing.T) {
		// A GPU pod that names its node itself is refused at admission, as a
		// guarded cluster refuses it.
		rogue := playground.PodSpec{Name: "rogue", GPUs: 1, MemoryMiB: 4096, Cores: 10}.Pod(ns)
		rogue.Spec.NodeName = c.Nodes[2].Name
		if _, err := client.CoreV1().Pods(ns).Create(context.Background(), rogue, metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
			!strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'tessera-gpu-pod-node-name'") {
			t.Fatalf("GPU pod naming its node: %v, want refused by tessera-gpu-pod-node-name", err)
		}
		// So is a GPU pod for another scheduler, and a binding by anyone but a
		// scheduler (issue 38: slots hoarded through kube-scheduler or a
		// binding without an assignment).
		rogue.Spec.NodeName, rogue.Spec.SchedulerName = "", "elsewhere"
		if _, err := client.CoreV1().Pods(ns).Create(context.Background(), rogue, metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
			!strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'tessera-gpu-pod-scheduler'") {
			t.Fatalf("GPU pod for another scheduler: %v, want refused by tessera-gpu-pod-scheduler", err)
		}
		// Past admission (pods created before the policies were installed),
		// the agent is the second guard. A pod of no Tessera profile, bound by
		// an administrator without an assignment: the agent refuses its slots
		// and kubelet shows why.
		beforePolicies(t, c, func() {
			refused(t, client, rogue, c.Nodes[2].Name, nil, c.Config, deviceplugin.ErrNoAssignment)
		})
		// The same, bound with an assignment by tessera-scheduler's own
		// identity (a trusted writer gone wrong): not a Tessera profile's pod,
		// so the assignment is not honoured.
		inv, err := inventory.FromNode(mustNode(t, client, c.Nodes[2].Name))
		if err != nil || inv == nil {
			t.Fatalf("inventory of %s: %v", c.Nodes[2].Name, err)
		}
		forged := playground.PodSpec{Name: "forged", GPUs: 1, MemoryMiB: 4096, Cores: 10}.Pod(ns)
		forged.Spec.SchedulerName = "elsewhere"
		a, err := gpu.EncodeAssignment(&gpu.PodAssignment{Node: c.Nodes[2].Name, Containers: []gpu.ContainerAssignment{{Name: forged.Spec.Containers[0].Name,
			Mode: gpu.ModeTimeSlicing, GPUs: []gpu.GPUGrant{{UUID: inv.GPUs[0].UUID, Index: inv.GPUs[0].Index, MemoryMiB: 4096, CoresPerMille: 100}}}}})
		if err != nil {
			t.Fatal(err)
		}
		beforePolicies(t, c, func() {
			refused(t, client, forged, c.Nodes[2].Name, map[string]string{gpu.AnnotationAssignment: a},
				playground.As(c.Config, deploy.SchedulerUser, nil), deviceplugin.ErrNotTesseraScheduled)
		})

	})

	phase("inventory restored", func(t *testing.T) {
		// An inventory overwritten with garbage (here by a token of that
		// node's agent, the only identity the policies let write it) is
		// restored by the agent, and a Warning event on the real API server
		// says so.
		// Before that, every agent has published its inventory several times
		// (at start, as pods came and went): none took its own writes for
		// someone else's (issue 38: the warning followed the agent's own
		// updates, so a real change looked routine).
		if evs, err := client.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		} else {
			for _, e := range evs.Items {
				if e.Reason == "GPUInventoryRestored" {
					t.Errorf("node %s: %s before anyone else wrote an inventory: %s", e.Regarding.Name, e.Reason, e.Note)
				}
			}
		}
		garbage := []byte(`{"metadata":{"annotations":{"` + gpu.AnnotationInventory + `":"{\"v\":\"v1\",\"gpus\":[{\"memoryMiB\":300000}"}}}`)
		agentOf2 := kubernetes.NewForConfigOrDie(playground.AsAgent(c.Config, c.Nodes[2].Name))
		if _, err := agentOf2.CoreV1().Nodes().Patch(context.Background(), c.Nodes[2].Name, types.MergePatchType, garbage, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
			n, err := inventory.FromNode(mustNode(t, client, c.Nodes[2].Name))
			if err != nil || n == nil {
				return false, nil
			}
			evs, err := client.EventsV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for _, e := range evs.Items {
				if e.Reason == "GPUInventoryRestored" && e.Regarding.Name == c.Nodes[2].Name {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("garbage inventory on %s not restored with an event: %v", c.Nodes[2].Name, err)
		}

	})

	phase("kubelet restart", func(t *testing.T) {
		// Kubelet restarts on the node of "whole": the pod runs on with its
		// slots (the device manager's checkpoint), and the agent registers
		// again on the new kubelet.sock, so a GPU pod sent there afterwards
		// (once the plugin is back, as an operator waits for allocatable)
		// starts.
		wholeNode := byNode[pods["whole"].Spec.NodeName]
		before := held(t, wholeNode.PodResourcesSocket)[ns+"/whole/main"]
		if err := wholeNode.RestartKubelet(); err != nil {
			t.Fatal(err)
		}
		var after []string
		err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			after = held(t, wholeNode.PodResourcesSocket)[ns+"/whole/main"]
			return len(after) > 0, nil
		})
		if err != nil || fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("after kubelet's restart, whole holds %v, want %v (%v)", after, before, err)
		}
		if p, err := client.CoreV1().Pods(ns).Get(context.Background(), "whole", metav1.GetOptions{}); err != nil || p.Status.Phase != v1.PodRunning {
			t.Fatalf("whole after kubelet's restart: %v", err)
		}
		err = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return wholeNode.DevicePluginServes(), nil
		})
		if err != nil {
			t.Fatalf("the agent's device plugin did not register again on %s's restarted kubelet: %v", wholeNode.Name, err)
		}
		afterRestart := playground.PodSpec{Name: "after-kubelet-restart", GPUs: 1, MemoryMiB: 4096, Cores: 10, Sharing: gpu.ModeAuto, PriorityClass: "gpu-standard"}.Pod(ns)
		afterRestart.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": wholeNode.Name}
		if _, err := client.CoreV1().Pods(ns).Create(context.Background(), afterRestart, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRunning(t, client, ns, []string{afterRestart.Name}, 30*time.Second)
		if err := client.CoreV1().Pods(ns).Delete(context.Background(), afterRestart.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}

	})

	phase("deletion releases slots and limits", func(t *testing.T) {
		// Deletion: kubelet stops the pod, releases its slots, removes it.
		tsNode := byNode[pods["ts"].Spec.NodeName]
		if err := client.CoreV1().Pods(ns).Delete(context.Background(), "ts", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := client.CoreV1().Pods(ns).Get(ctx, "ts", metav1.GetOptions{})
			return err != nil, nil
		})
		if err != nil {
			t.Fatal("deleted pod still there")
		}
		if s, ok := held(t, tsNode.PodResourcesSocket)[ns+"/ts/main"]; ok {
			t.Errorf("deleted pod still holds %v", s)
		}
		// Its kernel memory limit is removed by the agent's reconciliation,
		// though its cgroup lingers.
		err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
			_, ok := tsNode.MemoryLimit(tsAsg.Containers[0].GPUs[0].Index, tsPod.UID)
			return !ok, nil
		})
		if err != nil {
			t.Error("the deleted pod's kernel GPU memory limit was not removed")
		}

	})

	phase("refused pods deleted after the grace", func(t *testing.T) {
		// The pods refused their GPUs are deleted by their agent when the
		// grace is up, and kubelet holds their slots no more.
		err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, refusedGrace+30*time.Second, true, func(ctx context.Context) (bool, error) {
			for _, name := range []string{"rogue", "forged"} {
				if _, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Errorf("pods refused their GPUs still there %s after the grace (%s)", 30*time.Second, refusedGrace)
		}
		for key := range held(t, c.Nodes[2].PodResourcesSocket) {
			if strings.HasPrefix(key, ns+"/rogue/") || strings.HasPrefix(key, ns+"/forged/") {
				t.Errorf("%s still holds slots after its pod was deleted", key)
			}
		}

	})

	phase("Down", func(t *testing.T) {
		// Down stops every process and removes every file.
		var daemons []int
		pidFiles, _ := filepath.Glob(filepath.Join(c.Dir, "*", "mps", "*", "pipe", "fake.pid"))
		for _, f := range pidFiles {
			var pid int
			b, _ := os.ReadFile(f)
			if _, err := fmt.Sscan(string(b), &pid); err == nil {
				daemons = append(daemons, pid)
			}
		}
		if len(daemons) != 4 {
			t.Errorf("%d MPS daemons running, want 4", len(daemons))
		}
		c.Down()
		if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
			t.Errorf("state directory %s left behind: %v", c.Dir, err)
		}
		err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			return !slices.ContainsFunc(daemons, alive), nil
		})
		if err != nil {
			t.Errorf("MPS daemons still alive after Down: %v", daemons)
		}
		if _, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err == nil {
			t.Error("API server still answers after Down")
		}
	})
}

// alive reports whether a process exists (and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestFiftyPodsOnOneNode: 50 MPS pods created at once, all on one node,
// each start with exactly its own limits — kubelet's eight workers and the
// agent's lookups run concurrently, with no node-wide lock.
func TestFiftyPodsOnOneNode(t *testing.T) {
	c, _ := up(t, playground.Options{Nodes: 1, GPUsPerNode: 8, Model: "h200", MPSNodes: 1})
	const ns = "burst"
	var specs []playground.PodSpec
	var names []string
	for i := range 50 {
		// Cores differ per pod so that a mix-up shows in the limits.
		s := playground.PodSpec{Name: fmt.Sprintf("p%02d", i), GPUs: 1, MemoryMiB: 4096, Cores: 5 + i%11, Sharing: gpu.ModeMPS, Workload: gpu.WorkloadInference}
		specs, names = append(specs, s), append(names, s.Name)
	}
	var wg sync.WaitGroup
	for _, s := range specs {
		wg.Go(func() {
			if err := playground.Submit(context.Background(), c.Client, ns, []playground.PodSpec{s}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	start := time.Now()
	// The bound is generous: alone here the 50 starts take 44–59 s (each
	// runs the MPS control program), and under make test's other packages
	// they passed 60 s once. The test is about each pod's limits, not speed.
	pods := waitRunning(t, c.Client, ns, names, 3*time.Minute)
	t.Logf("50 pods Running %v after creation", time.Since(start).Round(time.Millisecond))
	n := c.Nodes[0]
	slots := held(t, n.PodResourcesSocket)
	for _, s := range specs {
		a, err := podgpu.BoundAssignment(pods[s.Name])
		if err != nil || a == nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		env := specEnv(t, n.CDIDir, slots[ns+"/"+s.Name+"/main"])
		if env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != fmt.Sprint(s.Cores) || env["NVIDIA_VISIBLE_DEVICES"] != a.Containers[0].GPUs[0].UUID {
			t.Errorf("%s (cores %d on %s) got %v", s.Name, s.Cores, a.Containers[0].GPUs[0].UUID, env)
		}
	}
}

// refused creates pod, binds it to node as binder's user with the binding's
// annotations, and waits until kubelet shows the agent's refusal of its GPU
// slots (want) on the pod.
func refused(t *testing.T, client kubernetes.Interface, pod *v1.Pod, node string, annotations map[string]string, binder *rest.Config, want error) {
	t.Helper()
	ctx := context.Background()
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Annotations: annotations},
		Target: v1.ObjectReference{Kind: "Node", Name: node}}
	if err := kubernetes.NewForConfigOrDie(binder).CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("bind %s: %v", pod.Name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return false, nil
		}
		return strings.Contains(p.Status.ContainerStatuses[0].State.Waiting.Message, want.Error()), nil
	})
	if err != nil {
		p, _ := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		t.Fatalf("%s not refused with %q: %+v", pod.Name, want, p.Status)
	}
}

// refusedGrace is how long TestPlayground's agents let a pod refused its
// GPUs hold its slots.
const refusedGrace = 20 * time.Second

// beforePolicies runs fn on a cluster as it was before Tessera's policies
// that keep GPU pods to Tessera's scheduler were installed (their bindings
// removed), for pods that got in then; it installs them again after.
func beforePolicies(t *testing.T, c *playground.Cluster, fn func()) {
	t.Helper()
	ctx := context.Background()
	for _, p := range []string{"tessera-gpu-pod-scheduler", "tessera-pod-binding"} {
		if err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The admission plugin lets go of them a moment later: until then an
	// administrator's binding of a pod that does not exist is refused
	// rather than not found.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		b := &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "no-such-pod"}, Target: v1.ObjectReference{Kind: "Node", Name: c.Nodes[0].Name}}
		err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Bind(ctx, b, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		p := playground.PodSpec{Name: "no-such-pod", GPUs: 1}.Pod(metav1.NamespaceDefault)
		p.Spec.SchedulerName = "elsewhere"
		_, err = c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the policies' bindings were deleted but still in force after a minute: %v", err)
	}
	fn()
	if err := playground.Guard(ctx, c.Config); err != nil {
		t.Fatal(err)
	}
}

func mustNode(t *testing.T, client kubernetes.Interface, name string) *v1.Node {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
