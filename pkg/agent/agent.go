// Package agent wires the node agent together: NVML (pkg/nvml), fault
// handling (health), the device plugin or, on a DRA node, the DRA driver
// (dra; Options.DRA chooses per node), the MPS daemons, time-slicing
// (timeslice), isolation (isolation), the node's part of preemption
// (nodepreempt), refused pods (refusal), the metrics sampler, the slice
// adjuster, and the inventory it builds and publish keeps on the Node. Each
// part is its own package with its own tests; this one connects them and
// records their events.
//
// One GPU container's road, from kubelet's Allocate to its CDI spec and its
// limits:
//
//  1. deviceplugin.Plugin.Allocate names the container's slots as CDI
//     devices (deviceplugin/plugin.go).
//  2. deviceplugin.Plugin.PreStartContainer finds which pod and container
//     hold the slots (Holder: kubelet's pod-resources API), reads the pod's
//     assignment (pkg/podgpu) and checks it against the node's inventory
//     and what was granted before (deviceplugin/honour.go; the inventory
//     through Config.Inventory, a publish.Publisher).
//  3. The container's edits (deviceplugin/edits.go), with the driver's
//     (isolation.Enforcer.DriverEdits, from driverspec), and its limits put
//     in force (isolation.Enforcer.Isolate: MPS server limits through the
//     mps package, kernel memory limits through memlimit), or the
//     container refused.
//  4. The spec written (deviceplugin.WriteSpec), and the answer reported
//     (Config.Reporter, a refusal.Tracker).
//
// No callback of the device plugin reaches this package: the inventory is
// publish.Publisher's, the pre-start report refusal.Tracker's, isolation
// and the driver's edits one interface (deviceplugin.Enforcer), the MPS
// pipes and the preemption notice directories the methods of their own
// packages.
package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/agent/adjuster"
	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/agent/health"
	"github.com/tessera-gpu/tessera/pkg/agent/isolation"
	"github.com/tessera-gpu/tessera/pkg/agent/metrics"
	"github.com/tessera-gpu/tessera/pkg/agent/mps"
	"github.com/tessera-gpu/tessera/pkg/agent/nodepods"
	"github.com/tessera-gpu/tessera/pkg/agent/nodepreempt"
	"github.com/tessera-gpu/tessera/pkg/agent/publish"
	"github.com/tessera-gpu/tessera/pkg/agent/reclaim"
	"github.com/tessera-gpu/tessera/pkg/agent/refusal"
	"github.com/tessera-gpu/tessera/pkg/agent/shim"
	"github.com/tessera-gpu/tessera/pkg/agent/tenants"
	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/inventory"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/version"
)

// Options configure an Agent.
type Options struct {
	Node   string
	Config *config.Configuration
	Client kubernetes.Interface
	// NVML is gonvml.New() on a node, a mock server in tests.
	NVML gonvml.Interface
	// AllowNoGPU runs an empty node when NVML cannot load, instead of
	// failing.
	AllowNoGPU bool
	// MPS runs every GPU in MPS mode, one daemon each; otherwise GPUs are
	// time-sliced.
	MPS       bool
	MPSBinary string
	MPSRoot   string
	// AssignmentChanges, from nodepods.Pods.Changes, are reported (log, event on
	// the pod, tessera_agent_assignment_changes_total); the change itself
	// was already undone.
	AssignmentChanges <-chan nodepods.AssignmentChange
	// SchedulerNames are the scheduler profiles that run TesseraGPU
	// (deviceplugin.DefaultSchedulerNames when empty); assignments on pods
	// naming another scheduler are refused.
	SchedulerNames []string
	// Holder and Pods serve the device plugin's PreStartContainer.
	Holder deviceplugin.Holder
	Pods   deviceplugin.Pods
	// CDIDir receives the slots' CDI specs.
	CDIDir string
	// ProcRoot is /proc with the host's PID namespace.
	ProcRoot string
	// NodePods lists this node's pods, for per-tenant metrics and
	// preemption.
	NodePods tenants.PodSource
	// NoticeRoot holds each pod's preemption notice directory, mounted into
	// its GPU containers (/run/tessera/preemption on a node); empty turns
	// the agent's part of preemption off.
	NoticeRoot string
	// Kill ends a preempted pod's leftover GPU process (SIGKILL when nil).
	Kill func(pid uint32) error
	// Signal sends a victim's GPU processes the signal its pod asked for
	// with its notice (kill(2) when nil).
	Signal func(pid uint32, sig syscall.Signal) error
	// TimeSlicer sets time-shared GPUs' time-slice class; nil uses the
	// driver's nvidia-smi at NvidiaSMI (looked up on $PATH by default).
	TimeSlicer timeslice.Setter
	NvidiaSMI  string
	// CgroupRoot is the host's cgroup v2 hierarchy (/sys/fs/cgroup on a
	// node), where the agent sets pods' kernel GPU memory limits; empty
	// turns them off (GPUs then report no kernel memory limits).
	CgroupRoot string
	// DriverRoot is where the driver's files are as the agent sees them,
	// at the same paths as on the host ("/" for a host install); NVIDIA's
	// CDI generator writes its device nodes and libraries into every slot
	// spec. Empty leaves containers' GPUs to NVIDIA_VISIBLE_DEVICES.
	DriverRoot string
	// CDIHookPath is nvidia-cdi-hook on the host (nvcdi's default when
	// empty).
	CDIHookPath string
	// ShimRoot is the host directory where the agent keeps libtessera and
	// each container's limits (/run/tessera/shim on a node); ShimLibrary is
	// the library to put there (shim.DefaultLibrary when empty). Empty
	// ShimRoot puts the library in no container: slices it would hold are
	// then accounted only, and the inventory says why.
	ShimRoot    string
	ShimLibrary string
	// IsolationEvery is how often kernel memory limits and MPS server
	// limits follow the GPUs' tenants (10 s when zero).
	IsolationEvery time.Duration
	// Namespace holds the agent's heartbeat Lease (inventory.Heartbeat);
	// empty sends none.
	Namespace string
	// HostRoot is the host's file system as the agent sees it ("/" in its
	// container, with the host's /proc, /sys and kubelet's directories):
	// the node checks of tessera doctor run there at start and on
	// /doctor. Empty turns them off.
	HostRoot string
	// HeartbeatEvery is how often the Lease is renewed
	// (inventory.HeartbeatEvery when zero); it vouches for four times
	// that.
	HeartbeatEvery time.Duration
	// SpecCollectEvery is how often the CDI specs of containers that no
	// longer hold their slots are removed (30 s when zero).
	SpecCollectEvery time.Duration
	// RefusedGrace is how long a pod refused its GPUs may hold its slots
	// before the agent deletes it (refusal.DefaultGrace when zero).
	RefusedGrace time.Duration
	// Now is the clock of the refusal grace (time.Now when nil).
	Now func() time.Time
	// DRA says whether this node serves its GPUs through the DRA driver
	// gpu.tessera.dev instead of the device plugin (DRANever when empty).
	DRA DRAOptions
}

// DRAMode says where a node serves its GPUs through the DRA driver. A node
// serves them through one of the two, never both: claims allocated by the
// DRA allocator and slots booked by TesseraGPU do not see each other.
type DRAMode string

// DRA modes.
const (
	DRANever DRAMode = "never"
	// DRAAlways: every node this agent runs on.
	DRAAlways DRAMode = "always"
	// DRANodeLabel: nodes labelled dra.NodeLabel=true, read when the
	// agent starts (moving a node is a label and an agent restart).
	DRANodeLabel DRAMode = "node-label"
)

// ParseDRAMode reads --dra.
func ParseDRAMode(s string) (DRAMode, error) {
	switch m := DRAMode(s); m {
	case DRANever, DRAAlways, DRANodeLabel:
		return m, nil
	}
	return "", fmt.Errorf("%q: give never, always or node-label (DRA on the nodes labelled %s=true)", s, dra.NodeLabel)
}

// DRAOptions say whether and where the DRA driver serves kubelet.
type DRAOptions struct {
	Mode DRAMode
	// PluginDir holds the driver's socket and its checkpoint of prepared
	// claims (dra.DefaultPluginDir on a node).
	PluginDir string
	// RegistryDir is kubelet's plugin registration directory
	// (dra.DefaultRegistryDir); empty registers nothing.
	RegistryDir string
}

// Agent is one node's agent.
type Agent struct {
	opts    Options
	gpus    *nvml.Client // nil on an empty node
	devices []nvml.DeviceInfo
	health  *health.Tracker
	plugin  *deviceplugin.Plugin
	mpsMgr  *mps.Manager // nil unless the node runs MPS
	sampler *metrics.Sampler
	reg     *prometheus.Registry
	// m are this agent's event series (agentmetrics.go), registered on reg.
	m *agentMetrics
	// collectors are what reg holds, for MetricDescs.
	collectors []prometheus.Collector

	// pub publishes the inventory and keeps it (package publish).
	pub *publish.Publisher
	// adj decides each GPU's slice count from its forecast load; adjMu
	// guards it (the adjuster is not safe for concurrent use) and lastEval.
	adjMu    sync.Mutex
	adj      *adjuster.Adjuster
	lastEval time.Time

	// preempt is the node's part of preemption (package nodepreempt).
	preempt *nodepreempt.Preemptor
	// refused follows the pods refused their GPUs that still hold slots
	// (package refusal).
	refused *refusal.Tracker
	// events and recorder send the agent's events (events.go); nil
	// without an API server.
	events   record.EventBroadcaster
	recorder record.EventRecorderLogger
	// timeSlices keeps time-shared GPUs at their class (nil where the node
	// runs MPS or has no time-shared GPU); it is not Enabled where no way
	// to set one was found, and noTimeSlicer says why.
	timeSlices   *timeslice.Controller
	noTimeSlicer error

	// enforcer holds tenants to their slices (package isolation).
	enforcer *isolation.Enforcer
	// shim puts libtessera into containers (nil: it is not offered, and
	// noShim says why).
	shim   *shim.Dir
	noShim error

	// draDriver prepares claims (nil unless Options.DRA may serve them);
	// draServer serves kubelet once Run chose DRA for this node.
	draDriver  *dra.Driver
	draMu      sync.Mutex
	draServer  *dra.Server
	servingDRA atomic.Bool
	// noGPU is why the agent runs as an empty node (NVML's error), or "".
	noGPU string
}

// New opens NVML and reads the GPUs. Without a driver it fails with
// nvml.ErrNoDriver, unless AllowNoGPU asks for an empty node.
func New(opts Options) (*Agent, error) {
	cfg := opts.Config
	a := &Agent{opts: opts, health: health.New(cfg.Health.IgnoredXids, cfg.Health.QuietPeriod.Duration), reg: prometheus.NewRegistry(), m: newAgentMetrics()}
	if opts.Client != nil {
		// Started before anything else so that no event is lost; Run's
		// end shuts it down.
		a.events, a.recorder = newEventRecorder(opts.Client, opts.Node)
	}
	adj, err := adjuster.New(cfg.Fragments)
	if err != nil {
		return nil, err
	}
	a.adj = adj
	c, err := nvml.New(opts.NVML)
	switch {
	case errors.Is(err, nvml.ErrNoDriver) && opts.AllowNoGPU:
		klog.Background().Info("No NVIDIA driver; running as an empty node", "err", err)
		a.noGPU = err.Error()
	case err != nil:
		return nil, err
	default:
		a.gpus = c
		a.devices, err = c.Devices()
		if err != nil && a.devices == nil {
			return nil, err
		}
		if err != nil {
			klog.Background().Error(err, "Some GPUs could not be read; they are left out")
		}
	}
	// Every GPU starts at the most slices; the forecast lowers it.
	for _, d := range a.devices {
		a.adj.Track(d.UUID, cfg.Fragments.MaxSlices, 0)
	}
	if opts.MPS && a.gpus != nil {
		var gs []mps.GPU
		for _, d := range a.devices {
			if !d.MIGEnabled {
				gs = append(gs, mps.GPU{UUID: d.UUID, DefaultThreadPercentage: 100})
			}
		}
		a.mpsMgr = mps.New(mps.Config{Binary: opts.MPSBinary, Root: opts.MPSRoot, GPUs: gs, PrepareGPU: a.exclusiveProcess,
			OnRestart: func(uuid string, cause error) {
				a.m.mpsRestarts.WithLabelValues(a.seriesLabels(uuid)...).Inc()
				note := cause.Error()
				// Who did it, as far as the agent can tell: the pods that
				// had this GPU's pipe directory.
				if clients := a.enforcer.MPSClients(uuid); len(clients) > 0 {
					note += "; the GPU's MPS clients then: " + strings.Join(clients, ", ")
				}
				a.event(context.Background(), v1.EventTypeWarning, "MPSDaemonRestarted", note)
			},
			OnTamper: func(uuid string, drift []mps.Drift) { a.enforcer.MPSTampered(uuid, drift) }})
	}
	pipe := func(uuid string) string { return "" }
	if a.mpsMgr != nil {
		pipe = a.mpsMgr.PipeDir
	}
	if shared := a.timeShared(); len(shared) > 0 {
		setter, err := timeslice.SetterFor(opts.TimeSlicer, opts.NvidiaSMI)
		a.noTimeSlicer = err
		labels := func(uuid string) []string { return a.seriesLabels(uuid) }
		a.timeSlices = timeslice.NewController(setter, shared, labels, a.event)
		a.register(a.timeSlices.Collectors()...)
	}
	a.shim, a.noShim = installShim(opts)
	if a.noShim != nil && opts.ShimRoot != "" {
		klog.Background().Error(a.noShim, "libtessera is not offered: slices only it would hold are accounted, not held", "shimDir", opts.ShimRoot)
	}
	a.enforcer = a.newEnforcer()
	a.preempt = a.newPreemptor()
	// The plugin takes the slots the Publisher publishes; it is made next.
	a.pub = publish.New(publish.Config{Node: opts.Node, Client: opts.Client, Build: a.Inventory,
		SetSlots: func(s []deviceplugin.GPUSlots) { a.plugin.SetGPUs(s) }, Event: a.event, Published: a.publishDRA})
	a.refused = refusal.New(refusal.Config{Node: opts.Node, Client: opts.Client, NodePods: opts.NodePods, Grace: opts.RefusedGrace, Now: opts.Now,
		NodeEvent: a.event, PodEvent: a.podEvent})
	var noticeDir deviceplugin.NoticeDir
	if opts.NoticeRoot != "" {
		noticeDir = a.preempt.NoticeDir
	}
	dpc := deviceplugin.Config{Node: opts.Node, SchedulerNames: opts.SchedulerNames, Holder: opts.Holder, Pods: opts.Pods, PipeDir: pipe, CDIDir: opts.CDIDir, NoticeDir: noticeDir,
		Reporter: a.refused, Shim: a.shim}
	if a.gpus != nil {
		dpc.Enforcer = a.enforcer
	}
	if opts.NodePods != nil {
		// Every assignment is checked against this node's GPUs and what
		// was granted before it, whoever wrote it.
		dpc.Inventory, dpc.NodePods, dpc.MemoryOversubscription = a.pub, opts.NodePods, opts.Config.Allocator.MemoryOversubscription
	}
	a.plugin = deviceplugin.New(dpc)
	if opts.DRA.Mode != "" && opts.DRA.Mode != DRANever {
		dc := dra.Config{Node: opts.Node, CDIDir: opts.CDIDir, StateDir: opts.DRA.PluginDir, Inventory: a.pub, PipeDir: pipe, Shim: a.shim,
			MemoryOversubscription: cfg.Allocator.MemoryOversubscription, Booked: a.bookedByDevicePlugin, Pods: opts.Pods, SchedulerNames: opts.SchedulerNames, NoticeDir: noticeDir,
			Reclaiming: a.preempt.Reclaiming}
		if dc.StateDir == "" {
			dc.StateDir = dra.DefaultPluginDir
		}
		if a.gpus != nil {
			dc.DriverEdits, dc.Isolator = a.enforcer, a.enforcer
		}
		if a.draDriver, err = dra.New(dc); err != nil {
			return nil, err
		}
		a.register(a.draDriver.Collectors()...)
	}
	if a.gpus != nil {
		var res *tenants.Resolver
		if opts.NodePods != nil {
			res = tenants.NewResolver(opts.ProcRoot, opts.NodePods)
		}
		var slices metrics.Slices
		if opts.NodePods != nil {
			slices = a.slices
		}
		a.sampler = metrics.NewSampler(opts.Node, a.gpus, res, a.health, slices, cfg.Stall.Window.Duration)
		a.register(a.sampler)
	}
	a.zeroCounters()
	a.enforcer.Probe(klog.NewContext(context.Background(), klog.Background()))
	a.register(a.enforcer.Collectors()...)
	a.register(modeCollector{a}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tessera_agent_build_info", Help: "1, with the agent's version and revision.",
			ConstLabels: prometheus.Labels{"node": opts.Node, "version": version.Version, "revision": version.Rev()}}, func() float64 { return 1 }))
	a.register(a.m.collectors()...)
	a.register(a.preempt.Collectors()...)
	a.register(a.refused.Collectors()...)
	return a, nil
}

// newEnforcer is the node's isolation, on this agent's GPUs, MPS daemons,
// time-slicing, events and inventory.
func (a *Agent) newEnforcer() *isolation.Enforcer {
	cfg := isolation.Config{Node: a.opts.Node, Client: a.opts.Client, NodePods: a.opts.NodePods, GPUs: a.gpus, NVML: a.opts.NVML,
		Devices: a.devices, MPS: a.mpsMgr, NoTimeSlicer: a.noTimeSlicer, CgroupRoot: a.opts.CgroupRoot, Shim: a.shim != nil, NoShim: a.noShim,
		DriverRoot: a.opts.DriverRoot, CDIHookPath: a.opts.CDIHookPath, Labels: a.seriesLabels, Event: a.event,
		Publish: func(ctx context.Context) error { return a.Refresh(ctx, time.Now()) },
		// The driver is made after the enforcer; claims count once it is.
		Claims: func() []gpu.ClaimTenant {
			if a.draDriver == nil {
				return nil
			}
			return a.draDriver.Tenants()
		}}
	cfg.TimeSliceClasses = a.mpsMgr == nil && a.timeSlices != nil && a.timeSlices.Enabled()
	return isolation.New(cfg)
}

// installShim puts libtessera where containers get it from, when the
// agent is given a shim directory.
func installShim(opts Options) (*shim.Dir, error) {
	if opts.ShimRoot == "" {
		return nil, errors.New("the agent was given no --shim-dir")
	}
	lib := opts.ShimLibrary
	if lib == "" {
		lib = shim.DefaultLibrary
	}
	return shim.Install(opts.ShimRoot, lib)
}

// newPreemptor is the node's part of preemption, on this agent's GPUs,
// health tracker, events and inventory.
func (a *Agent) newPreemptor() *nodepreempt.Preemptor {
	cfg := nodepreempt.Config{Node: a.opts.Node, Client: a.opts.Client, NodePods: a.opts.NodePods, NoticeRoot: a.opts.NoticeRoot,
		Signal: a.opts.Signal, Quarantine: a.health.Fault, Event: a.event,
		Publish: func(ctx context.Context) error { return a.Refresh(ctx, time.Now()) },
		// The driver is made after the preemptor; claims count once it is.
		ClaimGPUs: func() map[types.UID][]string {
			if a.draDriver == nil {
				return nil
			}
			return a.draDriver.GPUsByPod()
		}}
	for _, d := range a.devices {
		cfg.GPUs = append(cfg.GPUs, d.UUID)
	}
	if a.gpus != nil {
		kill := a.opts.Kill
		if kill == nil {
			kill = func(pid uint32) error { return syscall.Kill(int(pid), syscall.SIGKILL) }
		}
		cfg.Reclaimer = &reclaim.Reclaimer{GPUs: a.gpus, ProcRoot: a.opts.ProcRoot, Kill: kill, Wait: 5 * time.Second, Poll: 100 * time.Millisecond}
		if a.mpsMgr != nil {
			cfg.Reclaimer.Terminate = a.mpsMgr.TerminateClient
		}
	}
	return nodepreempt.New(cfg)
}

// MPSManager is the node's MPS daemons' manager, nil where the node does
// not run MPS: the playground sends its daemons a tenant's commands and
// stops them on its way down.
func (a *Agent) MPSManager() *mps.Manager { return a.mpsMgr }

// mpsCheckEvery is how often each MPS daemon is asked whether it lives and
// its limits read back: a limit a client changes through the control
// endpoint is restored within that (and the control program's run).
const mpsCheckEvery = 3 * time.Second

// isolationReconcileEvery is how often kernel memory limits and MPS server
// limits follow the GPUs' tenants.
const isolationReconcileEvery = 10 * time.Second

// seriesLabels are the label values of a per-GPU series of this node's GPU
// uuid (gpu.SeriesLabels), then extra. A GPU the agent has not read (it
// cannot happen for one it acts on) keeps its UUID, with index -1.
func (a *Agent) seriesLabels(uuid string, extra ...string) []string {
	for _, d := range a.devices {
		if d.UUID == uuid {
			return append(gpu.SeriesLabelValues(a.opts.Node, d.Index, d.UUID, d.Model), extra...)
		}
	}
	return append(gpu.SeriesLabelValues(a.opts.Node, -1, uuid, ""), extra...)
}

// zeroCounters exports the event counters at 0 for every label set they
// can take on this node, so that Prometheus' increase() sees their first
// event (a series born at 1 has no increase).
func (a *Agent) zeroCounters() {
	node := a.opts.Node
	a.m.assignmentChanges.WithLabelValues(node)
	for _, d := range a.devices {
		if a.mpsMgr != nil {
			a.m.mpsRestarts.WithLabelValues(a.seriesLabels(d.UUID)...)
		}
		for _, dir := range []string{"up", "down"} {
			a.m.sliceChanges.WithLabelValues(a.seriesLabels(d.UUID, dir)...)
		}
	}
}

func (a *Agent) exclusiveProcess(uuid string) error {
	return a.gpus.SetComputeMode(uuid, gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
}

// slicesOf is a GPU's slice count, as the adjuster sets it. The inventory
// carries it to the scheduler, which places no more tenants on the GPU, and
// the device plugin advertises as many slots for it: slots are
// interchangeable tokens, and with every GPU's tenants within its count the
// node's tokens always cover its containers, so kubelet never refuses a pod
// the scheduler placed.
func (a *Agent) slicesOf(uuid string) int {
	a.adjMu.Lock()
	defer a.adjMu.Unlock()
	return a.adj.Slices(uuid)
}

// allocated counts, per GPU UUID, the containers of this node's running pods
// assigned to it, from one listing of the node's pods.
func (a *Agent) allocated() map[string]int {
	out := map[string]int{}
	for uuid, t := range a.tenancy() {
		out[uuid] = t.containers
	}
	return out
}

// gpuTenancy is what a GPU's tenants are, as the node's pods say.
type gpuTenancy struct {
	// containers assigned to the GPU.
	containers int
	// inference: one of them belongs to an unfinished inference pod.
	inference bool
}

// tenancy walks this node's pods once, decoding each assignment, and a DRA
// node's prepared claims: the slice counts and the time-slice classes both
// come from it.
func (a *Agent) tenancy() map[string]gpuTenancy {
	out := map[string]gpuTenancy{}
	var pods []*v1.Pod
	if a.opts.NodePods != nil {
		pods = a.opts.NodePods()
	}
	for _, p := range pods {
		asg, err := podgpu.BoundAssignment(p)
		if err != nil || asg == nil || asg.Node != a.opts.Node {
			continue
		}
		finished := podgpu.Finished(p)
		w, _ := gpu.ParseWorkloadClass(p.Annotations[gpu.AnnotationWorkload])
		for _, c := range asg.Containers {
			for _, g := range c.GPUs {
				t := out[g.UUID]
				t.containers++
				t.inference = t.inference || (!finished && w == gpu.WorkloadInference)
				out[g.UUID] = t
			}
		}
	}
	// A DRA node's claims hold slices too (one each, however many
	// containers share it).
	if a.draDriver != nil && a.servingDRA.Load() {
		for _, c := range a.draDriver.Assignments() {
			for _, g := range c.GPUs {
				t := out[g.UUID]
				t.containers++
				out[g.UUID] = t
			}
		}
	}
	return out
}

// slices is, per GPU, what it is advertised as and how many containers are
// assigned to it: the metrics' slice series, once per sampling pass.
func (a *Agent) slices() map[string]metrics.SliceCount {
	used := a.allocated()
	out := make(map[string]metrics.SliceCount, len(a.devices))
	for _, d := range a.devices {
		out[d.UUID] = metrics.SliceCount{Total: a.slicesOf(d.UUID), Allocated: used[d.UUID]}
	}
	return out
}

// Inventory is the node's GPUs as of now, with their health.
func (a *Agent) Inventory(now time.Time) *gpu.NodeInventory {
	inv := &gpu.NodeInventory{Node: a.opts.Node, GPUs: []gpu.Device{}}
	for _, d := range a.devices {
		ok, _, _ := a.health.Healthy(d.UUID, now)
		dev := d.Device(ok, a.mpsMgr != nil)
		dev.Slices = a.slicesOf(d.UUID)
		if a.gpus != nil {
			o := a.enforcer.Offer(d.UUID)
			dev.Isolation = &o
		}
		inv.GPUs = append(inv.GPUs, dev)
	}
	inv.Reclaimed = a.preempt.Reclaimed()
	inv.DRA = a.servingDRA.Load()
	inv.NoGPU = a.noGPU
	return inv
}

// Refresh publishes the inventory and the device plugin's slots when they
// changed: after a fault, a recovery, or at start.
func (a *Agent) Refresh(ctx context.Context, now time.Time) error {
	return a.pub.Publish(ctx, now)
}

// Adjust feeds one pass's utilization (0–1 per GPU UUID; NaN or absent for
// a missing sample) to the slice adjuster and, every fragments.evaluateEvery,
// lets it decide. A change is logged, counted, and published: the scheduler
// reads it from the inventory, kubelet from ListAndWatch.
func (a *Agent) Adjust(ctx context.Context, util map[string]float64, now time.Time) {
	var decisions []adjuster.Decision
	a.adjMu.Lock()
	for _, d := range a.devices {
		u, ok := util[d.UUID]
		if !ok {
			u = math.NaN()
		}
		a.adj.Observe(d.UUID, u)
	}
	evaluate := now.Sub(a.lastEval) >= a.opts.Config.Fragments.EvaluateEvery.Duration
	a.adjMu.Unlock()
	if !evaluate {
		return
	}
	inUse := a.allocated()
	a.adjMu.Lock()
	a.lastEval = now
	for _, d := range a.devices {
		a.adj.SetInUse(d.UUID, inUse[d.UUID])
		if dec := a.adj.Evaluate(d.UUID, now); dec.Changed() {
			decisions = append(decisions, dec)
		}
	}
	a.adjMu.Unlock()
	if len(decisions) == 0 {
		return
	}
	logger := klog.FromContext(ctx)
	for _, dec := range decisions {
		dir := "down"
		if dec.To > dec.From {
			dir = "up"
		}
		a.m.sliceChanges.WithLabelValues(a.seriesLabels(dec.GPU, dir)...).Inc()
		logger.Info("GPU slice count changed", "gpu", dec.GPU, "from", dec.From, "to", dec.To, "forecast", dec.Forecast, "reason", dec.Reason)
		a.event(ctx, v1.EventTypeNormal, string(dec.Reason),
			fmt.Sprintf("GPU %s: %d → %d slices (forecast utilization %.0f%%)", dec.GPU, dec.From, dec.To, 100*dec.Forecast))
	}
	if err := a.Refresh(ctx, now); err != nil {
		logger.Error(err, "Publishing the new slice counts failed; retrying at the next pass")
	}
}

// reportAssignmentChanges reports each ignored change of a bound pod's
// assignment: a log line, a Warning event on the pod, and the counter.
func (a *Agent) reportAssignmentChanges(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ch := <-a.opts.AssignmentChanges:
			a.m.assignmentChanges.WithLabelValues(a.opts.Node).Inc()
			now := "removed"
			if ch.Now != "" {
				now = "changed"
			}
			klog.FromContext(ctx).Error(nil, "A bound pod's GPU assignment was "+now+" after binding; the agent keeps the first",
				"pod", klog.KObj(ch.Pod), "first", ch.First, "now", ch.Now)
			a.podEvent(ctx, ch.Pod.Namespace, ch.Pod.Name, ch.Pod.UID, v1.EventTypeWarning, "GPUAssignmentChanged",
				fmt.Sprintf("annotation %s was %s after the pod was bound; it keeps the GPUs it was first assigned", gpu.AnnotationAssignment, now))
		}
	}
}

// Observe feeds an NVML event to the fault handling and republishes.
func (a *Agent) Observe(ctx context.Context, ev nvml.Event, now time.Time) {
	var all []string
	for _, d := range a.devices {
		all = append(all, d.UUID)
	}
	if a.health.Observe(ev, now, all...) {
		klog.FromContext(ctx).Info("GPU fault; its slices are out of service", "gpu", ev.UUID, "xid", ev.Xid, "type", ev.Type)
		a.event(ctx, v1.EventTypeWarning, "GPUFault",
			fmt.Sprintf("GPU %s out of service: XID %d (event type %d); back after %v without faults", ev.UUID, ev.Xid, ev.Type, a.opts.Config.Health.QuietPeriod.Duration))
		if err := a.Refresh(ctx, now); err != nil {
			klog.FromContext(ctx).Error(err, "Publishing the fault failed; retrying at the next pass")
		}
	}
}

// modeCollector exports each GPU's sharing mode: tessera_gpu_sharing_mode
// {…, mode} 1, mode mps (the agent runs its MPS daemon), time-slicing, or
// mig (MIG GPUs are not sliced).
type modeCollector struct{ a *Agent }

var gpuModeDesc = prometheus.NewDesc("tessera_gpu_sharing_mode",
	"How the GPU is shared: mps (an MPS daemon per GPU), time-slicing, or mig (not sliced by Tessera). Always 1.",
	append(append([]string{}, gpu.SeriesLabels...), "mode"), nil)

func (c modeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- gpuModeDesc }

func (c modeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, d := range c.a.devices {
		mode := string(gpu.ModeTimeSlicing)
		switch {
		case d.MIGEnabled:
			mode = "mig"
		case c.a.mpsMgr != nil:
			mode = string(gpu.ModeMPS)
		}
		ch <- prometheus.MustNewConstMetric(gpuModeDesc, prometheus.GaugeValue, 1, c.a.seriesLabels(d.UUID, mode)...)
	}
}

func (a *Agent) register(cs ...prometheus.Collector) {
	a.reg.MustRegister(cs...)
	a.collectors = append(a.collectors, cs...)
}

// MetricDescs describes every metric family the agent exports, from its
// collectors' own descriptors: what dashboards and rules may name.
func (a *Agent) MetricDescs() []*prometheus.Desc {
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range a.collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	var out []*prometheus.Desc
	for d := range ch {
		out = append(out, d)
	}
	return out
}

// MetricsHandler serves the agent's Prometheus metrics.
func (a *Agent) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{})
}

// Run runs every part until ctx ends: the MPS daemons, the device plugin in
// pluginDir, the fault watch, the sampling passes (which also return GPUs
// whose quiet period passed) and the metrics endpoint on metricsAddr (none
// when empty: the caller serves MetricsHandler itself).
func (a *Agent) Run(ctx context.Context, pluginDir, metricsAddr string) error {
	logger := klog.FromContext(ctx)
	if a.events != nil {
		defer a.events.Shutdown()
	}
	if a.mpsMgr != nil {
		if err := a.mpsMgr.Start(ctx); err != nil {
			return fmt.Errorf("MPS: %w", err)
		}
		go a.mpsMgr.Run(ctx, mpsCheckEvery)
	}
	if a.gpus != nil && a.mpsMgr == nil {
		timeslice.Prepare(ctx, a.gpus, a.devices)
		if a.noTimeSlicer != nil {
			logger.Error(a.noTimeSlicer, "Time-shared GPUs keep the driver's default time slice")
		}
		a.applyTimeSlices(ctx, time.Now())
	}
	// Decided before the first inventory: a DRA node's says so, and
	// tessera-scheduler places no tessera.dev/gpu pod there.
	useDRA, err := a.servesDRA(ctx)
	if err != nil {
		return err
	}
	a.servingDRA.Store(useDRA)
	if err := a.Refresh(ctx, time.Now()); err != nil {
		return err
	}
	errc := make(chan error, 3)
	if useDRA {
		srv, err := dra.Serve(ctx, a.draDriver, dra.ServeOptions{Client: a.opts.Client, PluginDir: a.opts.DRA.PluginDir, RegistryDir: a.opts.DRA.RegistryDir,
			Policy: a.draPolicy()})
		if err != nil {
			return err
		}
		defer srv.Stop()
		a.draMu.Lock()
		a.draServer = srv
		a.draMu.Unlock()
		if inv := a.pub.Published(); inv != nil {
			if err := srv.Publish(ctx, inv, a.heldByDevicePlugin()); err != nil {
				return fmt.Errorf("DRA: publishing the node's ResourceSlice: %w", err)
			}
		}
		// Pods placed through the device plugin before the node moved
		// end on their own time; what they free is offered as they do.
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			if inv := a.pub.Published(); inv != nil {
				a.publishDRA(ctx, inv)
			}
		}, 5*time.Second)
		logger.Info("Serving this node's GPUs through DRA, not the device plugin", "driver", dra.DriverName, "mode", a.opts.DRA.Mode)
	} else {
		go func() { errc <- a.plugin.Run(ctx, pluginDir, time.Second) }()
	}
	collectEvery := a.opts.SpecCollectEvery
	if collectEvery <= 0 {
		collectEvery = 30 * time.Second
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		// Slot specs are collected on a DRA node too: a node moved from
		// the device plugin keeps its old pods' until they end.
		if a.opts.Holder == nil {
			// No pod-resources API (a test's agent): nothing says which
			// slots are held, so nothing is collected.
		} else if n, err := a.plugin.CollectSpecs(ctx); err != nil {
			logger.Error(err, "Collecting CDI specs of finished containers failed")
		} else if n > 0 {
			logger.V(2).Info("Collected CDI specs of finished containers", "count", n)
		}
		a.collectShim(ctx)
	}, collectEvery)
	go wait.UntilWithContext(ctx, func(ctx context.Context) { a.preempt.Pass(ctx, time.Now()) }, 250*time.Millisecond)
	if a.opts.AssignmentChanges != nil {
		go a.reportAssignmentChanges(ctx)
	}
	go a.pub.Keep(ctx)
	if a.opts.Namespace != "" {
		beat := a.opts.HeartbeatEvery
		if beat <= 0 {
			beat = inventory.HeartbeatEvery
		}
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			if err := inventory.Heartbeat(ctx, a.opts.Client, a.opts.Namespace, a.opts.Node, time.Now(), 4*beat); err != nil {
				logger.Error(err, "Heartbeat not renewed; tessera doctor will report this agent as silent")
			}
		}, beat)
	}
	go wait.UntilWithContext(ctx, a.refused.Prune, 5*time.Second)
	// At start it also finds limits a crashed agent left behind.
	every := a.opts.IsolationEvery
	if every <= 0 {
		every = isolationReconcileEvery
	}
	go wait.UntilWithContext(ctx, a.enforcer.Reconcile, every)
	if a.gpus != nil {
		go func() {
			// Without events a fault is only seen when the GPU stops
			// answering: degraded, not fatal.
			if err := a.gpus.WatchEvents(ctx, func(ev nvml.Event) { a.Observe(ctx, ev, time.Now()) }); err != nil {
				logger.Error(err, "Not watching GPUs for XID events; faults will be seen only when a GPU stops answering")
			}
		}()
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			now := time.Now()
			if err := a.sampler.Pass(now); err != nil {
				logger.V(2).Info("Sampling pass incomplete", "err", err)
			}
			a.Adjust(ctx, a.sampler.Utilization(), now)
			a.applyTimeSlices(ctx, now)
			if err := a.Refresh(ctx, now); err != nil {
				logger.Error(err, "Publishing the GPU inventory failed")
			}
		}, a.opts.Config.Fragments.SampleInterval.Duration)
	}
	if a.opts.HostRoot != "" {
		go a.reportDoctor(ctx)
	}
	if metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/doctor", a.DoctorHandler())
		mux.Handle("/", a.MetricsHandler())
		srv := &http.Server{Addr: metricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics endpoint: %w", err)
			}
		}()
		defer srv.Close()
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// servesDRA says whether this node serves its GPUs through DRA: by
// Options.DRA, and for node-label by the Node's label now.
func (a *Agent) servesDRA(ctx context.Context) (bool, error) {
	switch a.opts.DRA.Mode {
	case DRAAlways:
		return true, nil
	case DRANodeLabel:
		n, err := a.opts.Client.CoreV1().Nodes().Get(ctx, a.opts.Node, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("reading node %s's %s label (--dra=node-label): %w", a.opts.Node, dra.NodeLabel, err)
		}
		if n.Labels[dra.NodeLabel] == "true" {
			return true, nil
		}
		// Moved back while claims are still prepared here: the device
		// plugin would leave kubelet no driver to unprepare them with.
		if a.draDriver != nil {
			if held := a.draDriver.Prepared(); len(held) > 0 {
				klog.FromContext(ctx).Info("The node is no longer labelled for DRA, but claims are still prepared here: serving DRA until they end; restart the agent then",
					"label", dra.NodeLabel, "claims", len(held))
				a.event(ctx, v1.EventTypeWarning, "DRAClaimsStillPrepared", fmt.Sprintf(
					"node no longer labelled %s=true, but %d gpu.tessera.dev claim(s) are still prepared here: the agent serves DRA until they end; restart it then to serve the device plugin", dra.NodeLabel, len(held)))
				return true, nil
			}
		}
		return false, nil
	}
	return false, nil
}

// draPolicy is what the DRA driver's request policies say, from the
// allocator's configuration: the smallest workload class minimum, and
// the memory oversubscription.
func (a *Agent) draPolicy() dra.Policy {
	al := a.opts.Config.Allocator
	return dra.Policy{MinMemoryMiB: min(al.MinSliceMiB.Training, al.MinSliceMiB.Inference), MemoryOversubscription: al.MemoryOversubscription}
}

// publishDRA republishes the node's ResourceSlice after the inventory
// changed, once the driver serves.
func (a *Agent) publishDRA(ctx context.Context, inv *gpu.NodeInventory) {
	a.draMu.Lock()
	srv := a.draServer
	a.draMu.Unlock()
	if srv == nil {
		return
	}
	if err := srv.Publish(ctx, inv, a.heldByDevicePlugin()); err != nil {
		klog.FromContext(ctx).Error(err, "Publishing the node's ResourceSlice failed; retrying at the next change")
	}
}

// bookedByDevicePlugin is the assignments of this node's unfinished pods
// placed through the device plugin (tessera-scheduler's).
func (a *Agent) bookedByDevicePlugin() []*gpu.PodAssignment {
	var out []*gpu.PodAssignment
	if a.opts.NodePods == nil {
		return out
	}
	for _, p := range a.opts.NodePods() {
		if asg, err := podgpu.BoundAssignment(p); err == nil && asg != nil && asg.Node == a.opts.Node {
			out = append(out, asg)
		}
	}
	return out
}

// heldByDevicePlugin is what those pods hold of each GPU.
func (a *Agent) heldByDevicePlugin() map[string]dra.Held {
	out := map[string]dra.Held{}
	for _, asg := range a.bookedByDevicePlugin() {
		for _, c := range asg.Containers {
			for _, g := range c.GPUs {
				h := out[g.UUID]
				h.MemoryMiB += g.MemoryMiB
				h.CoresPerMille += g.CoresPerMille
				h.Containers++
				out[g.UUID] = h
			}
		}
	}
	return out
}

// timeShared is the GPUs this agent time-slices: none on a node in MPS
// mode, else timeslice.Shared.
func (a *Agent) timeShared() []string {
	if a.mpsMgr != nil || a.gpus == nil {
		return nil
	}
	return timeslice.Shared(a.devices)
}

// applyTimeSlices brings every time-shared GPU to the class its tenants
// call for: the IO-bound length where any tenant is an inference pod, the
// compute-bound one otherwise (and on a GPU with no tenant). The
// Controller reports what happened.
func (a *Agent) applyTimeSlices(ctx context.Context, now time.Time) {
	if a.timeSlices == nil {
		return
	}
	tenants := a.tenancy()
	gpus := a.timeShared()
	want := make(map[string]timeslice.Class, len(gpus))
	for _, uuid := range gpus {
		want[uuid] = timeslice.ClassOf(a.opts.Config.TimeSlice, tenants[uuid].inference)
	}
	a.timeSlices.Apply(ctx, want, now)
}

// collectShim removes the libtessera directories of pods that ended or
// left the node. Without the node's pods it removes nothing.
func (a *Agent) collectShim(ctx context.Context) {
	if a.shim == nil || a.opts.NodePods == nil {
		return
	}
	live := map[string]bool{}
	for _, p := range a.opts.NodePods() {
		if !podgpu.Finished(p) {
			live[string(p.UID)] = true
		}
	}
	if n, err := a.shim.Collect(func(uid string) bool { return live[uid] }); err != nil {
		klog.FromContext(ctx).Error(err, "Collecting libtessera directories of ended pods failed")
	} else if n > 0 {
		klog.FromContext(ctx).V(2).Info("Collected libtessera directories of ended pods", "count", n)
	}
}
