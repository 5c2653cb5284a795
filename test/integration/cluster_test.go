// Package integration runs Tessera's components against a real control plane:
// etcd and kube-apiserver in-process (no download), and the real
// kube-scheduler with the TesseraGPU plugin, started the way
// cmd/tessera-scheduler starts it.
package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/configz"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/apiservertest"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/claimadmission"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	preemptioncontroller "github.com/tessera-gpu/tessera/pkg/preemption/controller"
	"github.com/tessera-gpu/tessera/pkg/scheduler"
)

const tesseraScheduler = "tessera-scheduler"

// cluster is one control plane for one test.
type cluster struct {
	t          testing.TB
	ctx        context.Context
	client     kubernetes.Interface
	kubeconfig string
	dir        string
}

// startCluster starts etcd and kube-apiserver in-process.
func startCluster(t testing.TB, flags ...string) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	// As kubeadm and managed clusters set it: node agents run privileged.
	cfg := apiservertest.Start(t, append([]string{"--allow-privileged=true"}, flags...)...)
	cfg.QPS, cfg.Burst = 1000, 2000
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &cluster{t: t, ctx: ctx, client: client, dir: t.TempDir()}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := playground.WriteKubeconfig(cfg, c.kubeconfig); err != nil {
		t.Fatal(err)
	}
	return c
}

// schedulerConfig is deploy/scheduler-config.yaml for a cluster of one
// scheduler (the upstream default profile, which the benchmark's baseline
// uses, served too), pointed at the test's API server, with the given
// plugin arguments.
func (c *cluster) schedulerConfig(pluginArgs string) string {
	c.t.Helper()
	cfg := deploy.StandaloneSchedulerConfig()
	if pluginArgs != "" {
		i := strings.Index(cfg, "      - name: TesseraGPU\n        args:\n")
		if i < 0 {
			c.t.Fatal("shipped config has no TesseraGPU args")
		}
		cfg = cfg[:i] + "      - name: TesseraGPU\n        args: " + pluginArgs + "\n"
	}
	return cfg + fmt.Sprintf("clientConnection: {kubeconfig: %q, qps: 2000, burst: 4000}\n", c.kubeconfig)
}

// runningScheduler is a tessera-scheduler started in-process.
type runningScheduler struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startScheduler runs the scheduler as cmd/tessera-scheduler does: flags,
// app.Setup with the TesseraGPU plugin, app.Run.
// Extra flags are the binary's own (--claim-admission-*), after
// kube-scheduler's.
func (c *cluster) startScheduler(pluginArgs string, flags ...string) *runningScheduler {
	c.t.Helper()
	path := filepath.Join(c.dir, fmt.Sprintf("scheduler-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(path, []byte(c.schedulerConfig(pluginArgs)), 0o600); err != nil {
		c.t.Fatal(err)
	}
	opts := options.NewOptions()
	fs := pflag.NewFlagSet(tesseraScheduler, pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	var admission claimadmission.Options
	admission.AddFlags(fs)
	if err := fs.Parse(append([]string{"--config", path, "--secure-port", "0"}, flags...)); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	cc, sched, err := app.Setup(ctx, opts, scheduler.RegisterWith(preemptioncontroller.Start, admission.Start))
	if err != nil {
		cancel()
		c.t.Fatalf("scheduler setup: %v", err)
	}
	// app.Run registers the configuration on the process-wide configz
	// endpoint; a second scheduler in this process must find the name free.
	configz.Delete("componentconfig")
	rs := &runningScheduler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rs.done)
		if err := app.Run(ctx, cc, sched); err != nil && ctx.Err() == nil {
			c.t.Errorf("scheduler stopped: %v", err)
		}
	}()
	c.t.Cleanup(rs.stop)
	return rs
}

// stop stops the scheduler and waits until it has returned.
func (rs *runningScheduler) stop() {
	rs.cancel()
	<-rs.done
}

// gpuNode is a node with its GPUs, as a test describes it.
type gpuNode struct {
	name  string
	gpus  int
	memMi int64
	mps   bool
	model string
}

// addNode registers a Node as kubelet would and publishes its GPU inventory
// with the agent's client code.
func (c *cluster) addNode(n gpuNode) *gpu.NodeInventory {
	c.t.Helper()
	c.registerNode(n.name)
	inv := nodeInventory(n)
	if _, err := inventory.Publish(c.ctx, c.client, inv); err != nil {
		c.t.Fatal(err)
	}
	return inv
}

// registerNode creates a Ready Node with CPU, memory and pod capacity, as
// kubelet would, and no GPU inventory yet.
func (c *cluster) registerNode(name string) {
	c.t.Helper()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	node, err := c.client.CoreV1().Nodes().Create(c.ctx, node, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	// tessera.dev/gpu is what the agent's device plugin makes kubelet
	// advertise: its slots, here more than any test uses.
	res := v1.ResourceList{v1.ResourceCPU: resource.MustParse("256"), v1.ResourceMemory: resource.MustParse("2Ti"), v1.ResourcePods: resource.MustParse("1000"),
		gpu.ResourceGPU: resource.MustParse("1000")}
	node.Status = v1.NodeStatus{Capacity: res, Allocatable: res,
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(c.ctx, node, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func nodeInventory(n gpuNode) *gpu.NodeInventory {
	model := n.model
	if model == "" {
		model = "NVIDIA H100 80GB HBM3"
	}
	inv := &gpu.NodeInventory{Node: n.name, CPUMilli: 256000, MemoryMiB: 2 << 20}
	for i := range n.gpus {
		var peers []int
		for j := range n.gpus {
			if j != i {
				peers = append(peers, j)
			}
		}
		inv.GPUs = append(inv.GPUs, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%s-%02d", n.name, i), Model: model,
			MemoryMiB: n.memMi, SMCount: 132, Healthy: true, MPSCapable: n.mps, NVLinkPeers: peers})
	}
	return inv
}

// podSpec describes a test pod.
type podSpec struct {
	name        string
	gpus        int
	memMi       int64
	cores       int
	annotations map[string]string
	priority    *int32
	// zeroCores writes tessera.dev/gpu-cores: 0 explicitly.
	zeroCores bool
}

func (c *cluster) createPod(ns string, p podSpec) *v1.Pod {
	c.t.Helper()
	pod, err := c.client.CoreV1().Pods(ns).Create(c.ctx, makePod(ns, p), metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return pod
}

func makePod(ns string, p podSpec) *v1.Pod {
	lim := v1.ResourceList{}
	if p.gpus > 0 {
		lim[gpu.ResourceGPU] = *resource.NewQuantity(int64(p.gpus), resource.DecimalSI)
	}
	if p.memMi > 0 {
		lim[gpu.ResourceMemory] = *resource.NewQuantity(p.memMi, resource.DecimalSI)
	}
	if p.cores > 0 || p.zeroCores {
		lim[gpu.ResourceCores] = *resource.NewQuantity(int64(p.cores), resource.DecimalSI)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns, Annotations: p.annotations},
		Spec: v1.PodSpec{
			SchedulerName: tesseraScheduler,
			Containers: []v1.Container{{Name: "main", Image: "registry.example/cuda:12", Resources: v1.ResourceRequirements{
				Limits:   lim,
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")},
			}}},
		},
	}
}

func (c *cluster) namespace(name string) string {
	c.t.Helper()
	if _, err := c.client.CoreV1().Namespaces().Create(c.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	return name
}

// waitBound waits until the named pods are all bound, and returns them.
func (c *cluster) waitBound(ns string, names []string, timeout time.Duration) map[string]*v1.Pod {
	c.t.Helper()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var got map[string]*v1.Pod
	err := wait.PollUntilContextTimeout(c.ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		got = map[string]*v1.Pod{}
		for i := range list.Items {
			p := &list.Items[i]
			if want[p.Name] && p.Spec.NodeName != "" {
				got[p.Name] = p
			}
		}
		return len(got) == len(want), nil
	})
	if err != nil {
		var missing []string
		for _, n := range names {
			if got[n] == nil {
				missing = append(missing, n)
			}
		}
		c.t.Fatalf("%d/%d pods bound after %v; first unbound: %v (%s: %q)", len(got), len(names), timeout,
			missing[:min(5, len(missing))], missing[0], c.unschedulableMessage(ns, missing[0]))
	}
	return got
}

// unschedulableMessage returns the PodScheduled=False message of a pod, or
// "" while it has none.
func (c *cluster) unschedulableMessage(ns, name string) string {
	p, err := c.client.CoreV1().Pods(ns).Get(c.ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse {
			return cond.Message
		}
	}
	return ""
}

// recount rebuilds every GPU's usage from the inventories and the pods'
// assignment annotations, independently of the scheduler: AddAssignment
// refuses any assignment that breaks a GPU's limits or mode, or names a GPU
// its node lacks. It fails the test on any such assignment and returns the
// rebuilt nodes.
func (c *cluster) recount(invs ...*gpu.NodeInventory) map[string]*allocator.Node {
	c.t.Helper()
	nodes := map[string]*allocator.Node{}
	for _, inv := range invs {
		n, err := allocator.NewNode(inv)
		if err != nil {
			c.t.Fatal(err)
		}
		nodes[inv.Node] = n
	}
	pods, err := c.client.CoreV1().Pods("").List(c.ctx, metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		a, err := podgpu.BoundAssignment(p)
		if err != nil {
			c.t.Fatalf("pod %s: %v", p.Name, err)
		}
		if a == nil {
			if p.Spec.NodeName != "" && podgpu.WantsGPU(p) {
				c.t.Fatalf("pod %s is bound to %s without an assignment", p.Name, p.Spec.NodeName)
			}
			continue
		}
		n := nodes[a.Node]
		if n == nil {
			c.t.Fatalf("pod %s: assignment for unknown node %s", p.Name, a.Node)
		}
		if err := n.AddAssignment(a, 0, 0, 1.5); err != nil {
			c.t.Fatalf("pod %s: %v", p.Name, err)
		}
	}
	return nodes
}
