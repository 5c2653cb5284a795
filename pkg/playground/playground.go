// Package playground runs a whole Tessera cluster in one process, with no
// cluster and no GPU: etcd and kube-apiserver in-process, tessera-scheduler
// as cmd/tessera-scheduler runs it, and N simulated GPU nodes. Each node runs
// the real agent (pkg/agent) on a go-nvml whole-server mock, beside a
// stand-in kubelet that uses kubelet's own device-plugin registration
// server, plugin client and pod-resources server, so every GPU pod goes
// through GetPreferredAllocation, Allocate and PreStartContainer before it
// is reported Running. It is what `tessera up` runs and the project's
// end-to-end harness.
package playground

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
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
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/pkg/agent"
	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/nodepods"
	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
	"github.com/tessera-gpu/tessera/pkg/agentendpoint"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/inventory"
)

// Options describe a playground.
type Options struct {
	Nodes       int
	GPUsPerNode int
	// Model is a100, h100 or h200.
	Model string
	// MPSNodes run their GPUs in MPS mode (the first MPSNodes nodes); the
	// others time-slice. MPS nodes need MPSControl.
	MPSNodes int
	// MPSControl runs the MPS control program's stand-in: a command line
	// that behaves as package mpssim does (`tessera mps-control`).
	MPSControl []string
	// Dir holds all state (a fresh temporary directory when empty) and is
	// removed by Down when the playground created it.
	Dir string
	// QuietPeriod is how long a faulted GPU stays out of service after its
	// last fault (the agents' health.quietPeriod); the default when zero.
	QuietPeriod time.Duration
	// FastSliceAdjuster makes the agents' slice adjuster decide within
	// seconds (a 20 s window, evaluated every second, three in a row, 5 s
	// apart) instead of minutes, so GPUs' slice counts change under a short
	// run's load (the soak).
	FastSliceAdjuster bool
	// SchedulerReplicas runs that many tessera-schedulers electing a
	// leader on the shipped Lease, as the chart's replicas do, one included
	// (tessera up's, which tessera doctor finds by its Lease); 0 runs one
	// scheduler without an election.
	SchedulerReplicas int
	// RefusedGrace is how long the agents let a pod refused its GPUs hold
	// its slots before deleting it (the agent's default when zero).
	RefusedGrace time.Duration
	// ReclaimTimeout is how long the scheduler waits for an agent's
	// reclaim confirmation of a preemption victim (the shipped
	// preemption.reclaimTimeout when zero).
	ReclaimTimeout time.Duration
	// AgentDaemonSet runs the chart's tessera-agent DaemonSet through
	// kube-controller-manager's DaemonSet controller: each node's agent
	// has its pod, which the node's kubelet reports ready while the agent
	// runs and crash-looping while it is stopped, and the DaemonSet's
	// status counts them, as kube-state-metrics reads them in a cluster.
	AgentDaemonSet bool
	// DRANodes serve their GPUs through the DRA driver gpu.tessera.dev
	// instead of the device plugin (the last DRANodes nodes, labelled
	// tessera.dev/dra=true; every agent runs with --dra=node-label): pods
	// there ask with ResourceClaims (or templates: kube-controller-manager's
	// ResourceClaim controller runs) of the chart's DeviceClasses (which
	// Guard creates with the agent's manifest), and their kubelet prepares
	// them with kubelet's own DRA manager.
	DRANodes int
	// DriverKernelLimits simulates a driver whose NVML sets per-cgroup GPU
	// memory limits (nvmlDeviceSetMemoryLimits_v1, newer than the R580
	// drivers GPU nodes run). Without it the mock driver refuses them, as
	// R580's does, and time-sliced slices are held by libtessera (shim).
	DriverKernelLimits bool
}

// Models are the GPU models a playground node can have.
var Models = []string{"a100", "h100", "h200"}

func newServer(model string, n int) (*server.Server, error) {
	switch model {
	case "a100":
		return dgxa100.NewWithGPUs(gpus.Multiple(n, gpus.A100_SXM4_80GB)...), nil
	case "h100":
		return dgxh100.NewWithGPUs(gpus.Multiple(n, gpus.H100_SXM5_80GB)...), nil
	case "h200":
		return dgxh200.NewWithGPUs(gpus.Multiple(n, gpus.H200_SXM5_141GB)...), nil
	}
	return nil, fmt.Errorf("--gpu-model %q: want one of %s", model, strings.Join(Models, ", "))
}

// Validate names the first bad option.
func (o Options) Validate() error {
	switch {
	case o.Nodes < 1 || o.Nodes > 64:
		return fmt.Errorf("--nodes %d: want 1–64", o.Nodes)
	case o.GPUsPerNode < 1 || o.GPUsPerNode > 8:
		return fmt.Errorf("--gpus-per-node %d: want 1–8 (the mocks are DGX servers)", o.GPUsPerNode)
	case o.MPSNodes < 0 || o.MPSNodes > o.Nodes:
		return fmt.Errorf("--mps-nodes %d: want 0–%d", o.MPSNodes, o.Nodes)
	case o.DRANodes < 0 || o.DRANodes > o.Nodes:
		return fmt.Errorf("--dra-nodes %d: want 0–%d", o.DRANodes, o.Nodes)
	case o.SchedulerReplicas < 0 || o.SchedulerReplicas > 3:
		return fmt.Errorf("scheduler replicas %d: want 0–3", o.SchedulerReplicas)
	case o.MPSNodes > 0 && len(o.MPSControl) == 0:
		return errors.New("MPS nodes need an MPS control program (MPSControl)")
	case o.ReclaimTimeout < 0:
		return fmt.Errorf("reclaim timeout %v: want a positive duration, or 0 for the shipped one", o.ReclaimTimeout)
	}
	_, err := newServer(o.Model, 1)
	return err
}

// Node is one simulated GPU node.
type Node struct {
	Name string
	MPS  bool
	// DRA: the node serves its GPUs through the DRA driver (Options.DRANodes).
	DRA bool
	// MetricsURL is the agent's Prometheus endpoint.
	MetricsURL string
	// NVML is the node's mock driver.
	NVML *server.Server
	// PodResourcesSocket is the node's kubelet pod-resources API; CDIDir
	// holds the slots' CDI specs the agent writes; MPSRoot the MPS
	// daemons' pipe and log directories.
	PodResourcesSocket, CDIDir, MPSRoot string
	// TimeSlices is what the agent set as each time-shared GPU's driver
	// time-slice class (the mock GPUs have no nvidia-smi behind them).
	TimeSlices *timeslice.Recorder
	// CgroupRoot is the node's cgroup v2 hierarchy: its kubelet makes each
	// pod's cgroup there before the pod's containers start, and the agent
	// sets kernel GPU memory limits on them through the mock driver.
	CgroupRoot string
	// ShimRoot is the agent's libtessera directory (--shim-dir): the
	// library, and each container's limits and usage directory.
	ShimRoot string

	// agentMu guards agent, which a restart replaces.
	agentMu sync.Mutex
	agent   *agent.Agent
	kubelet *kubelet
	load    *load
	metrics *http.Server
	conn    *grpc.ClientConn
	cancel  context.CancelFunc
	// stopAgent stops the agent alone; done closes when it has.
	stopAgent context.CancelFunc
	done      chan struct{}
	// startAgent starts the node's agent (again).
	startAgent func() error
	// agentUp is whether the agent runs: its metrics endpoint answers
	// and its pod (Options.AgentDaemonSet) is ready only then.
	agentUp atomic.Bool
}

// MemoryLimit is the kernel GPU memory limit the driver holds for a pod on
// GPU index i: its hard limit in bytes, and whether one is set.
func (n *Node) MemoryLimit(i int, pod types.UID) (hard uint64, ok bool) {
	_, hard, ok = n.load.limits[i].Limit(podCgroup(n.CgroupRoot, pod))
	return hard, ok
}

// makeCgroupRoot lays out a cgroup v2 root as a node with kubelet's systemd
// cgroup driver has it.
func makeCgroupRoot(root string) error {
	if err := os.MkdirAll(filepath.Join(root, "kubepods.slice", "kubepods-burstable.slice"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpuset cpu io memory hugetlb pids rdma misc dmem\n"), 0o644)
}

// podCgroup is where kubelet's systemd driver puts a burstable pod's
// cgroup.
func podCgroup(root string, uid types.UID) string {
	u := strings.ReplaceAll(string(uid), "-", "_")
	return filepath.Join(root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+u+".slice")
}

// InjectXid delivers an XID error on GPU index i as NVML would.
func (n *Node) InjectXid(i int, xid uint64) {
	n.load.events <- gonvml.EventData{Device: n.NVML.Devices[i], EventType: gonvml.EventTypeXidCriticalError, EventData: xid}
}

// Cluster is a running playground.
type Cluster struct {
	Dir        string
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	Nodes      []*Node
	// SchedulerMetricsURL is tessera-scheduler's /metrics (HTTPS,
	// self-signed; open to anonymous reads, as the playground allows).
	SchedulerMetricsURL string

	ownDir bool
	cp     *controlPlane
	// The scheduler: one (schedStop, schedDone), or replicas electing a
	// leader; every one serves its metrics on schedPort.
	schedPort  int
	schedStop  context.CancelFunc
	schedDone  chan struct{}
	schedMu    sync.Mutex
	replicas   []*schedulerReplica
	replicaSeq int
	downOnce   sync.Once
	// reclaimTimeout is Options.ReclaimTimeout, for every scheduler this
	// playground starts.
	reclaimTimeout time.Duration
	// stopDaemonSets stops the DaemonSet controller (Options.AgentDaemonSet).
	stopDaemonSets context.CancelFunc
	// stopClaims stops the ResourceClaim controller (Options.DRANodes).
	stopClaims context.CancelFunc
}

// Up starts a playground and returns when every node serves its GPUs: its
// inventory is published and its device plugin registered.
func Up(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: opts.Dir, reclaimTimeout: opts.ReclaimTimeout}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "tessera-up-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	// What started is stopped when a later part fails (c, not the nil
	// that is returned).
	defer func() {
		if err != nil {
			c.Down()
		}
	}()
	logger := klog.FromContext(ctx)
	if c.cp, err = startControlPlane(context.WithoutCancel(ctx), c.Dir); err != nil {
		return nil, err
	}
	c.Config = c.cp.config
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := WriteKubeconfig(c.Config, c.Kubeconfig); err != nil {
		return nil, err
	}
	logger.V(1).Info("Control plane up", "server", c.Config.Host)
	// Guarded as a cluster with Tessera installed is: the admission
	// policies and the components' RBAC, before any component starts.
	if err := Guard(ctx, c.Config); err != nil {
		return nil, fmt.Errorf("admission policies: %w", err)
	}
	if err := createPriorityClasses(ctx, c.Client); err != nil {
		return nil, err
	}
	if err := c.startScheduler(ctx, opts.SchedulerReplicas); err != nil {
		return nil, err
	}
	if opts.DRANodes > 0 {
		if err := c.runClaimController(ctx); err != nil {
			return nil, err
		}
	}
	var mpsControl string
	if opts.MPSNodes > 0 {
		if mpsControl, err = writeMPSControl(filepath.Join(c.Dir, "bin"), opts.MPSControl); err != nil {
			return nil, err
		}
	}
	for i := range opts.Nodes {
		n, err := c.startNode(ctx, opts, i, mpsControl)
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	if err := c.waitNodes(ctx, opts.GPUsPerNode); err != nil {
		return nil, err
	}
	if opts.AgentDaemonSet {
		if err := c.runAgentDaemonSet(ctx); err != nil {
			return nil, fmt.Errorf("tessera-agent DaemonSet: %w", err)
		}
	}
	return c, nil
}

// WriteKubeconfig writes a kubeconfig for cfg: server, CA, whichever
// credentials cfg carries (the loopback token here; client certificates
// elsewhere) and the identity it impersonates, if any.
func WriteKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["tessera"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthority: cfg.CAFile, CertificateAuthorityData: cfg.CAData,
		TLSServerName: cfg.ServerName, InsecureSkipTLSVerify: cfg.Insecure}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile,
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData,
		Impersonate: cfg.Impersonate.UserName, ImpersonateGroups: cfg.Impersonate.Groups, ImpersonateUserExtra: cfg.Impersonate.Extra}
	kc.Contexts["tessera-playground"] = &clientcmdapi.Context{Cluster: "tessera", AuthInfo: "admin", Namespace: metav1.NamespaceDefault}
	kc.CurrentContext = "tessera-playground"
	return clientcmd.WriteToFile(*kc, path)
}

func createPriorityClasses(ctx context.Context, client kubernetes.Interface) error {
	pcs, err := deploy.ShippedPriorityClasses()
	if err != nil {
		return err
	}
	for i := range pcs {
		if _, err := client.SchedulingV1().PriorityClasses().Create(ctx, &pcs[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("PriorityClass %s: %w", pcs[i].Name, err)
		}
	}
	return nil
}

// writeMPSControl writes nvidia-cuda-mps-control as a script running the
// stand-in: the agent's MPS manager runs it as it runs the real program.
func writeMPSControl(dir string, command []string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	quoted := make([]string, len(command))
	for i, a := range command {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	path := filepath.Join(dir, "nvidia-cuda-mps-control")
	script := "#!/bin/sh\n# The playground's stand-in for NVIDIA's MPS control program.\nexec " + strings.Join(quoted, " ") + " \"$@\"\n"
	return path, os.WriteFile(path, []byte(script), 0o755)
}

// writeShimStandIn writes the file the playground's agents install as
// libtessera. The playground's containers are not run, so the library is
// never loaded: the agents do everything else a node's does with it (the
// limits, the usage directory, the mounts in each container's CDI spec).
func writeShimStandIn(dir string) (string, error) {
	path := filepath.Join(dir, "libtessera.so")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	text := "# The playground's stand-in for libtessera (libtessera/out/libtessera.so on a node): its containers are simulated, nothing loads it.\n"
	return path, os.WriteFile(path, []byte(text), 0o644)
}

// maxSocketPath is the longest unix socket path Linux takes, less room for
// the plugin's socket name.
const maxSocketPath = 107 - len(deviceplugin.SocketPrefix+"1764745123456789012.sock") - 1

// startNode starts node i: its NVML mock and simulated load, its kubelet,
// and the real agent.
func (c *Cluster) startNode(ctx context.Context, opts Options, i int, mpsControl string) (*Node, error) {
	name := fmt.Sprintf("gpu-node-%d", i)
	dir := filepath.Join(c.Dir, name)
	if l := len(filepath.Join(dir, "kubelet", "device-plugins")); l > maxSocketPath {
		return nil, fmt.Errorf("state directory %s is too deep for unix sockets (%d > %d bytes); point TMPDIR at a shorter directory, such as /tmp", c.Dir, l, maxSocketPath)
	}
	srv, err := newServer(opts.Model, opts.GPUsPerNode)
	if err != nil {
		return nil, err
	}
	n := &Node{Name: name, MPS: i < opts.MPSNodes, DRA: i >= opts.Nodes-opts.DRANodes, NVML: srv, done: make(chan struct{}), TimeSlices: &timeslice.Recorder{}}
	procRoot := filepath.Join(dir, "proc")
	if n.load, err = newLoad(srv, procRoot, uint32(10_000+1_000_000*i), opts.DriverKernelLimits); err != nil {
		return nil, err
	}
	nctx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), klog.FromContext(ctx).WithValues("node", name)))
	n.cancel = cancel
	noticeRoot := filepath.Join(dir, "preemption")
	n.CgroupRoot = filepath.Join(dir, "cgroup")
	if err := makeCgroupRoot(n.CgroupRoot); err != nil {
		cancel()
		return nil, err
	}
	kubeletClient, err := kubernetes.NewForConfig(AsKubelet(c.Config, name))
	if err != nil {
		cancel()
		return nil, err
	}
	n.kubelet = newKubelet(name, filepath.Join(dir, "kubelet"), noticeRoot, kubeletClient, n.load)
	n.kubelet.draNode = n.DRA
	n.kubelet.cgroupRoot = n.CgroupRoot
	n.kubelet.agentUp = n.agentUp.Load
	n.PodResourcesSocket, n.CDIDir, n.MPSRoot = n.kubelet.podResourcesSocket(), filepath.Join(dir, "cdi"), filepath.Join(dir, "mps")
	if err := n.kubelet.start(nctx); err != nil {
		cancel()
		return nil, err
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return nil, err
	}
	n.MetricsURL = fmt.Sprintf("http://%s/metrics", l.Addr())
	// The endpoint outlives agent restarts, as a node's port does; while
	// the agent is stopped nothing answers there.
	n.metrics = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !n.agentUp.Load() {
			http.Error(w, "tessera-agent of node "+n.Name+" is not running", http.StatusServiceUnavailable)
			return
		}
		n.agentMu.Lock()
		a := n.agent
		n.agentMu.Unlock()
		a.MetricsHandler().ServeHTTP(w, r)
	}), ReadHeaderTimeout: 5 * time.Second}
	n.ShimRoot = filepath.Join(dir, "shim")
	shimLibrary, err := writeShimStandIn(dir)
	if err != nil {
		cancel()
		return nil, err
	}
	n.startAgent = func() error { return c.runAgent(nctx, opts, n, mpsControl, procRoot, noticeRoot, shimLibrary) }
	if err := n.startAgent(); err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = n.metrics.Serve(l) }()
	return n, nil
}

// runAgent builds and starts the node's agent as cmd/tessera-agent does on
// a node: the node's pods from an informer, the holder of slots from
// kubelet's pod-resources socket; all as the agent's service account with a
// token bound to this node.
func (c *Cluster) runAgent(nctx context.Context, opts Options, n *Node, mpsControl, procRoot, noticeRoot, shimLibrary string) error {
	agentClient, err := kubernetes.NewForConfig(AsAgent(c.Config, n.Name))
	if err != nil {
		return err
	}
	actx, stopAgent := context.WithCancel(nctx)
	nodePods := nodepods.Watch(agentClient, n.Name)
	if n.conn == nil {
		if n.conn, err = grpc.NewClient("unix://"+n.kubelet.podResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			stopAgent()
			return err
		}
	}
	cfg := config.Default()
	if opts.QuietPeriod > 0 {
		cfg.Health.QuietPeriod.Duration = opts.QuietPeriod
	}
	if opts.FastSliceAdjuster {
		f := &cfg.Fragments
		f.SampleInterval.Duration, f.Window.Duration, f.Horizon.Duration = 200*time.Millisecond, 20*time.Second, 5*time.Second
		f.EvaluateEvery.Duration, f.Consecutive, f.Cooldown.Duration = time.Second, 3, 5*time.Second
	}
	a, err := agent.New(agent.Options{
		Node: n.Name, Config: cfg, Client: agentClient, NVML: n.NVML,
		MPS: n.MPS, MPSBinary: mpsControl, MPSRoot: n.MPSRoot,
		Holder: deviceplugin.PodResourcesHolder{Client: podresourcesapi.NewPodResourcesListerClient(n.conn)},
		Pods:   nodePods.Get, CDIDir: n.CDIDir, ProcRoot: procRoot, NodePods: nodePods.List, AssignmentChanges: nodePods.Changes,
		NoticeRoot: noticeRoot, Kill: n.load.kill, Signal: n.load.signal, TimeSlicer: n.TimeSlices,
		CgroupRoot: n.CgroupRoot, IsolationEvery: time.Second, Namespace: agentendpoint.Namespace, HeartbeatEvery: time.Second,
		SpecCollectEvery: 2 * time.Second, RefusedGrace: opts.RefusedGrace, ShimRoot: n.ShimRoot, ShimLibrary: shimLibrary,
		// The node's kubelet registers the driver's socket with its DRA
		// manager itself (it runs no plugin watcher).
		DRA: agent.DRAOptions{Mode: agent.DRANodeLabel, PluginDir: n.kubelet.draPluginDir()},
	})
	if err != nil {
		stopAgent()
		return fmt.Errorf("node %s: agent: %w", n.Name, err)
	}
	nodePods.Factory.Start(actx.Done())
	nodePods.Factory.WaitForCacheSync(actx.Done())
	n.agentMu.Lock()
	n.agent = a
	n.agentMu.Unlock()
	n.stopAgent, n.done = stopAgent, make(chan struct{})
	done := n.done
	n.agentUp.Store(true)
	n.kubelet.agentChanged(nctx)
	go func() {
		defer close(done)
		if err := a.Run(actx, n.kubelet.pluginDir(), ""); err != nil && actx.Err() == nil {
			klog.FromContext(nctx).Error(err, "Agent stopped")
		}
	}()
	if n.DRA {
		go n.kubelet.registerDRA(actx)
	}
	return nil
}

// RestartAgent stops the node's agent and starts a new one, as a crashed
// agent pod's replacement: it finds the node's pods, slots and MPS daemons
// as the old one left them.
func (n *Node) RestartAgent() error {
	n.StopAgent()
	return n.startAgent()
}

// QuitMPS sends quit to GPU index i's MPS control daemon, as any tenant of
// the GPU can: the agent finds it dead and restarts it.
func (n *Node) QuitMPS(ctx context.Context, i int) error {
	_, err := n.MPSCommand(ctx, i, "quit")
	return err
}

// MPSCommand sends one control command to GPU index i's MPS control
// daemon through its control endpoint, as any tenant of the GPU can
// (set_default_active_thread_percentage 100, say), and returns its reply.
func (n *Node) MPSCommand(ctx context.Context, i int, command string) (string, error) {
	n.agentMu.Lock()
	a := n.agent
	n.agentMu.Unlock()
	if a.MPSManager() == nil {
		return "", fmt.Errorf("node %s runs no MPS", n.Name)
	}
	uuid, ret := n.NVML.Devices[i].GetUUID()
	if ret != 0 {
		return "", fmt.Errorf("node %s GPU %d: no UUID", n.Name, i)
	}
	return a.MPSManager().Control(ctx, uuid, command)
}

// RestartKubelet restarts the node's stand-in kubelet: its containers run on,
// its device manager keeps their slots, and the agent's device plugin must
// find the new kubelet.sock and register again before a new GPU pod starts.
func (n *Node) RestartKubelet() error {
	return n.kubelet.restart(nil)
}

// RestartKubeletAfter is RestartKubelet with down run while the kubelet is
// stopped (what the cluster does meanwhile, such as deleting its pods);
// its error is returned after the kubelet is started again.
func (n *Node) RestartKubeletAfter(down func() error) error {
	return n.kubelet.restart(down)
}

// DevicePluginServes reports whether the node's kubelet has the agent's
// device plugin registered with at least one healthy slot: after a kubelet
// restart, a GPU pod admitted before the plugin registers again is
// rejected, as a real kubelet rejects it.
func (n *Node) DevicePluginServes() bool {
	return n.kubelet.pluginServes()
}

// StopAgent stops the node's agent alone, as a crashed agent pod would
// leave the node: kubelet runs on, the agent's heartbeat goes silent.
func (n *Node) StopAgent() {
	n.stopAgent()
	<-n.done
	if n.DRA {
		n.kubelet.deregisterDRA()
	}
	n.agentUp.Store(false)
	n.kubelet.agentChanged(n.kubelet.nodeCtx)
}

// Signals are the signals the node's agent sent its simulated GPU
// processes, by PID.
func (n *Node) Signals() map[uint32][]syscall.Signal {
	n.load.mu.Lock()
	defer n.load.mu.Unlock()
	out := map[uint32][]syscall.Signal{}
	for pid, s := range n.load.signals {
		out[pid] = slices.Clone(s)
	}
	return out
}

// Stall makes GPU index i report its clocks held down by its power cap
// (on) or not: while it is busy, the agent counts the samples as stalls.
func (n *Node) Stall(i int, on bool) {
	n.load.stall(i, on)
}

// HangNVML makes the node's driver hang (on) in every utilization reading,
// as NVML does on a GPU fallen off the bus: the agent's sampling pass does
// not return. Off releases it.
func (n *Node) HangNVML(on bool) {
	n.load.hang(on)
}

// waitNodes waits until every node's inventory is published and its
// kubelet advertises the node's slots.
func (c *Cluster) waitNodes(ctx context.Context, gpusPerNode int) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range c.Nodes {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			inv, err := inventory.FromNode(node)
			if err != nil || inv == nil || len(inv.GPUs) != gpusPerNode {
				return false, nil
			}
			q := node.Status.Allocatable[v1.ResourceName(deviceplugin.ResourceName)]
			if q.Value() == 0 && !n.DRA {
				return false, nil
			}
			if n.DRA && !n.kubelet.draRegistered() {
				return false, nil
			}
		}
		return true, nil
	})
}

// Down stops everything Up started, in the order a node drains: agents and
// kubelets (and the MPS daemons, told to quit), the scheduler, the API
// server, etcd; then it removes the state directory it created.
func (c *Cluster) Down() {
	c.downOnce.Do(func() {
		logger := klog.Background()
		if c.stopDaemonSets != nil {
			c.stopDaemonSets()
		}
		if c.stopClaims != nil {
			c.stopClaims()
		}
		for _, n := range c.Nodes {
			n.load.hang(false) // an agent held in NVML could not stop
			n.cancel()
			<-n.done
			if n.agent != nil && n.agent.MPSManager() != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := n.agent.MPSManager().Stop(ctx); err != nil {
					logger.Error(err, "Stopping the MPS daemons", "node", n.Name)
				}
				cancel()
			}
			_ = n.metrics.Close()
			_ = n.conn.Close()
			n.kubelet.stop(logger)
			n.kubelet.stopAPI()
		}
		c.stopSchedulers()
		if c.cp != nil {
			c.cp.stop()
		}
		if c.ownDir {
			_ = os.RemoveAll(c.Dir)
		}
	})
}

// ReleaseStuck ends the node's GPU processes that ignored kill (as a GPU
// reset does) and says how many there were.
func (n *Node) ReleaseStuck() int {
	return n.load.releaseStuck()
}

// GPUProcesses counts the simulated GPU processes alive on the node, and of
// them those that ignore kill (stuck in the driver).
func (n *Node) GPUProcesses() (alive, unkillable int) {
	n.load.mu.Lock()
	defer n.load.mu.Unlock()
	for _, g := range n.load.gpus {
		alive += len(g.procs)
	}
	return alive, len(n.load.unkillable)
}

// NoticeDirs lists the per-pod preemption notice directories the agent
// keeps on the node.
func (n *Node) NoticeDirs() []string {
	entries, _ := os.ReadDir(filepath.Join(filepath.Dir(n.CDIDir), "preemption"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// Reregister deletes the node's Node object and registers it again, as a
// node removed from the cluster and rejoining does: its kubelet writes its
// capacity afresh and its agent republishes the inventory; its pods stay
// bound (nothing here collects them).
func (n *Node) Reregister(ctx context.Context) error {
	k := n.kubelet
	if err := k.client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := k.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		return fmt.Errorf("node %s not gone: %w", n.Name, err)
	}
	if err := k.registerNode(ctx); err != nil {
		return err
	}
	k.syncCapacity(ctx)
	return nil
}
