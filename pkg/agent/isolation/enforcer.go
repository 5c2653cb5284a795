// Package isolation puts each slice's limits in force and says what holds
// it: what each GPU's driver offers (kernel memory limits, probed on a
// scratch cgroup; MPS limits; time-slice classes), the limits set before a
// container starts (kernel memory limits on its pod's cgroup, its GPU's MPS
// server limits, read back), the reconciliation that follows the GPUs'
// tenants and removes what an ended pod or a crashed agent left, and what
// holds every slice — on the pod (the GPUIsolation condition), in the
// inventory (the offers) and in a metric. The rules are pure
// (gpu.GuaranteeOf, gpu.MPSServerLimitsFor, memlimit.Plan); the Enforcer
// does the I/O. The device plugin reaches it through deviceplugin.Enforcer.
package isolation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/pkg/agent/driverspec"
	"github.com/tessera-gpu/tessera/pkg/agent/memlimit"
	"github.com/tessera-gpu/tessera/pkg/agent/mps"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
)

// Config is what an Enforcer works with.
type Config struct {
	Node string
	// Client sets the pods' GPUIsolation condition.
	Client kubernetes.Interface
	// NodePods lists the node's pods (nil: none are known).
	NodePods func() []*v1.Pod
	// GPUs reads the driver; nil on a node without GPUs. NVML is the
	// library itself, for NVIDIA's CDI generator.
	GPUs *nvml.Client
	NVML gonvml.Interface
	// Devices are the node's GPUs as read at start.
	Devices []nvml.DeviceInfo
	// MPS manages the node's MPS daemons; nil where the node runs none.
	MPS *mps.Manager
	// TimeSliceClasses says a way to set time-slice classes was found;
	// NoTimeSlicer says why not, where it was not.
	TimeSliceClasses bool
	NoTimeSlicer     error
	// Shim says the agent puts libtessera into the containers of slices
	// nothing stronger holds; NoShim says why not, where it does not.
	Shim   bool
	NoShim error
	// CgroupRoot is the host's cgroup v2 hierarchy, where kernel memory
	// limits are set; empty turns them off.
	CgroupRoot string
	// DriverRoot and CDIHookPath are NVIDIA's CDI generator's (empty
	// DriverRoot: no driver edits).
	DriverRoot, CDIHookPath string
	// Labels gives a GPU's series label values, then extra.
	Labels func(uuid string, extra ...string) []string
	// Event records a node event.
	Event func(ctx context.Context, eventType, reason, note string)
	// Publish publishes the node's inventory again (new offers).
	Publish func(ctx context.Context) error
	// Claims, when set, lists the DRA claims prepared on the node (the
	// driver's): they are tenants of their GPUs as device-plugin pods are,
	// for the MPS server's limits and the kernel's memory limits.
	Claims func() []gpu.ClaimTenant
}

// Enforcer is one node's isolation.
type Enforcer struct {
	cfg Config
	// limiter sets kernel memory limits; nil without a cgroup root or GPUs.
	limiter *memlimit.Limiter

	// mu guards state and mpsConnected.
	mu    sync.Mutex
	state isolationState
	// mpsConnected is, per pod and GPU, the MPS server limits when the
	// pod's container started.
	mpsConnected map[types.UID]map[string]gpu.MPSServerLimits
	// mpsLimitsMu makes the MPS server limits' decisions one at a time.
	mpsLimitsMu sync.Mutex

	mpsLimitChanges *prometheus.CounterVec
}

// New returns an Enforcer, its offers not yet probed (Probe), with its
// series at 0 for every GPU they can take.
func New(cfg Config) *Enforcer {
	e := &Enforcer{cfg: cfg,
		mpsLimitChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tessera_mps_limit_changes_total",
			Help: "MPS limits found changed behind the agent (through the control endpoint its clients reach) and restored, per GPU.",
		}, gpu.SeriesLabels)}
	if cfg.GPUs != nil && cfg.CgroupRoot != "" {
		e.limiter = &memlimit.Limiter{NVML: cfg.GPUs, Root: cfg.CgroupRoot}
	}
	if cfg.MPS != nil {
		for _, d := range cfg.Devices {
			e.mpsLimitChanges.WithLabelValues(cfg.Labels(d.UUID)...)
		}
	}
	return e
}

// Collectors are the Enforcer's series, for the agent's registry.
func (e *Enforcer) Collectors() []prometheus.Collector {
	return []prometheus.Collector{collector{e}, e.mpsLimitChanges}
}

// MPSClients lists the pods of this node that are MPS clients of the GPU
// (the agent names them when it restarts the GPU's daemon).
func (e *Enforcer) MPSClients(uuid string) []string {
	if e.cfg.NodePods == nil {
		return nil
	}
	return MPSClientsOf(e.cfg.NodePods(), uuid)
}

// MPSClientsOf lists the pods among pods that are MPS clients of the GPU,
// namespace/name, sorted.
func MPSClientsOf(pods []*v1.Pod, uuid string) []string {
	var out []string
	for _, p := range pods {
		asg, err := podgpu.BoundAssignment(p)
		if err != nil || asg == nil {
			continue
		}
	pod:
		for _, c := range asg.Containers {
			for _, g := range c.GPUs {
				if c.Mode == gpu.ModeMPS && g.UUID == uuid {
					out = append(out, p.Namespace+"/"+p.Name)
					break pod
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// ConditionGPUIsolation is the pod condition the agent sets when a GPU
// container starts: True when every dimension of every slice of the pod is
// held by a mechanism (device, kernel, MPS server), False when some are only
// accounted or held for cooperating clients; the message says which, per
// container and GPU. Tenants read it with kubectl; inside the container,
// TESSERA_GPU_ISOLATION says the same.
const ConditionGPUIsolation v1.PodConditionType = gpu.ConditionIsolation

// isolationState is what the agent found its GPUs offer, and the driver's
// CDI edits, as of the driver version probed.
type isolationState struct {
	driver string
	offers map[string]gpu.IsolationOffer
	edits  *driverspec.Edits
}

// Probe finds, per GPU, what the driver offers to hold slices:
// kernel memory limits (tried on a scratch cgroup), MPS limits (the node
// runs MPS), time-slice classes (a way to set them was found). It also
// generates the driver's CDI edits. It runs at start and again when the
// driver version changes.
func (e *Enforcer) Probe(ctx context.Context) {
	if e.cfg.GPUs == nil {
		return
	}
	logger := klog.FromContext(ctx)
	driver, _, err := e.cfg.GPUs.DriverVersion()
	if err != nil {
		logger.Error(err, "Reading the driver version; isolation is probed again when it reads")
	}
	var uuids []string
	for _, d := range e.cfg.Devices {
		if !d.MIGEnabled {
			uuids = append(uuids, d.UUID)
		}
	}
	kernel, why := map[string]bool{}, map[string]string{}
	var probeErr error
	if e.limiter != nil {
		kernel, why, probeErr = e.limiter.Probe(uuids)
	}
	st := isolationState{driver: driver, offers: map[string]gpu.IsolationOffer{}}
	for _, d := range e.cfg.Devices {
		if d.MIGEnabled {
			st.offers[d.UUID] = gpu.IsolationOffer{Why: "MIG is enabled: Tessera does not slice this GPU"}
			continue
		}
		o := gpu.IsolationOffer{KernelMemoryLimits: kernel[d.UUID], MPSLimits: e.cfg.MPS != nil, TimeSliceClasses: e.cfg.MPS == nil && e.cfg.TimeSliceClasses,
			Shim: e.cfg.Shim}
		var reasons []string
		if !o.KernelMemoryLimits {
			switch {
			case e.limiter == nil:
				reasons = append(reasons, "kernel memory limits: the agent was given no cgroup root (--cgroup-root)")
			case why[d.UUID] != "":
				reasons = append(reasons, "kernel memory limits: "+why[d.UUID])
			case probeErr != nil:
				reasons = append(reasons, "kernel memory limits: "+probeErr.Error())
			}
		}
		if e.cfg.MPS == nil && e.cfg.NoTimeSlicer != nil {
			reasons = append(reasons, "time-slice classes: "+e.cfg.NoTimeSlicer.Error())
		}
		if !o.Shim && e.cfg.NoShim != nil {
			reasons = append(reasons, "shim: "+e.cfg.NoShim.Error())
		}
		o.Why = strings.Join(reasons, "; ")
		st.offers[d.UUID] = o
		logger.Info("GPU isolation offered", "gpu", d.UUID, "driver", driver, "kernelMemoryLimits", o.KernelMemoryLimits,
			"mpsLimits", o.MPSLimits, "timeSliceClasses", o.TimeSliceClasses, "shim", o.Shim, "why", o.Why)
	}
	if e.cfg.DriverRoot != "" {
		edits, err := driverspec.Generate(e.cfg.NVML, driverspec.Options{DriverRoot: e.cfg.DriverRoot, HookPath: e.cfg.CDIHookPath})
		if err != nil {
			logger.Error(err, "NVIDIA's CDI generator failed: containers get their GPUs through NVIDIA_VISIBLE_DEVICES and the runtime's hook alone",
				"driverRoot", e.cfg.DriverRoot)
			e.cfg.Event(ctx, v1.EventTypeWarning, "DriverEditsUnavailable",
				fmt.Sprintf("the driver's CDI edits could not be generated under %s, so GPU containers rest on NVIDIA_VISIBLE_DEVICES: %v", e.cfg.DriverRoot, err))
		} else {
			st.edits = edits
		}
	}
	e.mu.Lock()
	e.state = st
	e.mu.Unlock()
}

// Offer is a GPU's offer as last probed.
func (e *Enforcer) Offer(uuid string) gpu.IsolationOffer {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state.offers[uuid]
}

// DriverEdits gives the device plugin the driver's edits for a container's
// GPUs (nil where there are none).
func (e *Enforcer) DriverEdits(uuids []string) (*specs.ContainerEdits, error) {
	e.mu.Lock()
	edits := e.state.edits
	e.mu.Unlock()
	if edits == nil {
		return nil, nil
	}
	return edits.For(uuids)
}

// checkDriver probes again when the driver version changed (an upgrade
// under a running agent), and republishes the offers.
func (e *Enforcer) checkDriver(ctx context.Context) {
	if e.cfg.GPUs == nil {
		return
	}
	driver, _, err := e.cfg.GPUs.DriverVersion()
	e.mu.Lock()
	was := e.state.driver
	e.mu.Unlock()
	if err != nil || driver == was {
		return
	}
	klog.FromContext(ctx).Info("The GPU driver changed; probing what it offers to hold slices", "from", was, "to", driver)
	e.Probe(ctx)
	if err := e.cfg.Publish(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Publishing the new isolation offers failed; retrying at the next pass")
	}
}

// activePod is a pod of this node holding GPUs, and its assignment.
type activePod struct {
	pod *v1.Pod
	asg *gpu.PodAssignment
}

// activePods are this node's pods that hold GPUs and have not finished,
// plus starting (which kubelet is starting, in case the agent's pod list
// has not seen it yet).
func (e *Enforcer) activePods(starting *v1.Pod) []activePod {
	var out []activePod
	seen := false
	add := func(p *v1.Pod) {
		if podgpu.Finished(p) {
			return
		}
		asg, err := podgpu.BoundAssignment(p)
		if err != nil || asg == nil || asg.Node != e.cfg.Node {
			return
		}
		out = append(out, activePod{pod: p, asg: asg})
	}
	if e.cfg.NodePods != nil {
		for _, p := range e.cfg.NodePods() {
			if starting != nil && p.UID == starting.UID {
				seen = true
			}
			add(p)
		}
	}
	if starting != nil && !seen {
		add(starting)
	}
	return out
}

// limitedGPUs are the node's GPUs with their offers, as memlimit.Plan
// takes them.
func (e *Enforcer) limitedGPUs() []gpu.Device {
	out := make([]gpu.Device, 0, len(e.cfg.Devices))
	for _, d := range e.cfg.Devices {
		dev := d.Device(true, e.cfg.MPS != nil)
		o := e.Offer(d.UUID)
		dev.Isolation = &o
		out = append(out, dev)
	}
	return out
}

// unverifiedServer is what a client is taken to have connected under when
// the GPU's limits could not be read back as the agent set them: the whole
// GPU, so its slice counts as held only for a cooperating client.
var unverifiedServer = gpu.MPSServerLimits{ThreadPercent: 100}

// MPSTampered is the MPS manager's report of limits found changed behind
// the agent's back, before it restores them: a log line, a count, an event
// on the node naming the GPU and its clients, and every client connected
// on that GPU counted as held only by its own variables from now on (it
// may have connected under the changed limits, and keeps them).
func (e *Enforcer) MPSTampered(uuid string, drift []mps.Drift) {
	ctx := context.Background()
	what := make([]string, len(drift))
	for i, d := range drift {
		what[i] = d.String()
	}
	clients := e.MPSClients(uuid)
	klog.Background().Info("MPS limits changed behind the agent; restoring them", "gpu", uuid, "changes", what, "clients", clients)
	e.mpsLimitChanges.WithLabelValues(e.cfg.Labels(uuid)...).Inc()
	note := fmt.Sprintf("MPS limits of GPU %s changed by someone other than this node's tessera-agent (%s); restored", uuid, strings.Join(what, "; "))
	if len(clients) > 0 {
		note += "; the GPU's MPS clients then: " + strings.Join(clients, ", ")
	}
	e.cfg.Event(ctx, v1.EventTypeWarning, "MPSLimitsRestored", note)
	e.mu.Lock()
	affected := map[types.UID]bool{}
	for uid, byGPU := range e.mpsConnected {
		if _, ok := byGPU[uuid]; ok {
			byGPU[uuid] = unverifiedServer
			affected[uid] = true
		}
	}
	e.mu.Unlock()
	for _, p := range e.activePods(nil) {
		if affected[p.pod.UID] {
			e.report(ctx, p.pod, e.guaranteesOf(p.pod, p.asg))
		}
	}
}

// mpsServerLimits sets a GPU's MPS server limits to the tightest still
// correct for its MPS tenants among pods, reads them back, and returns what
// a client connecting now is held to: those limits, or the whole GPU
// (unverifiedServer) when they do not read back as set.
func (e *Enforcer) mpsServerLimits(ctx context.Context, uuid string, pods []activePod, claims []gpu.ClaimTenant) (gpu.MPSServerLimits, error) {
	var grants []gpu.GPUGrant
	add := func(c gpu.ContainerAssignment) {
		if c.Mode != gpu.ModeMPS {
			return
		}
		for _, g := range c.GPUs {
			if g.UUID == uuid {
				grants = append(grants, g)
			}
		}
	}
	for _, p := range pods {
		for _, c := range p.asg.Containers {
			add(c)
		}
	}
	// A claim's client is held to the server's limits too: limits set for
	// the device plugin's tenants alone would take from a larger claim.
	for _, c := range claims {
		add(c.Assignment)
	}
	want := gpu.MPSServerLimitsFor(grants)
	e.mpsLimitsMu.Lock()
	defer e.mpsLimitsMu.Unlock()
	if got, ok := e.cfg.MPS.ServerLimits(uuid); !ok || got != want {
		if err := e.cfg.MPS.SetServerLimits(ctx, uuid, want); err != nil {
			return gpu.MPSServerLimits{}, err
		}
		klog.FromContext(ctx).V(2).Info("MPS server limits set", "gpu", uuid, "threadPercent", want.ThreadPercent, "memoryMiB", want.MemoryMiB, "tenants", len(grants))
	}
	// Not what the agent last set, but what the daemon reports now: a
	// client may have changed it through the control endpoint.
	if !e.cfg.MPS.Ensure(ctx, uuid) {
		return unverifiedServer, nil
	}
	return want, nil
}

// Isolate is the device plugin's Enforcer.Isolate: it puts a starting container's
// limits in force — its GPU's MPS server limits, its pod's kernel memory
// limits — and says what holds each of its slices. An error refuses the
// container.
func (e *Enforcer) Isolate(ctx context.Context, pod *v1.Pod, c gpu.ContainerAssignment) ([]gpu.Guarantee, error) {
	pods, claims := e.activePods(pod), e.claims()
	if c.Mode == gpu.ModeMPS && e.cfg.MPS != nil {
		for _, g := range c.GPUs {
			l, err := e.mpsServerLimits(ctx, g.UUID, pods, claims)
			if err != nil {
				return nil, fmt.Errorf("MPS server limits of GPU %s: %w", g.UUID, err)
			}
			// The container connects under these limits and keeps them,
			// whatever the server is given later.
			e.mu.Lock()
			if e.mpsConnected == nil {
				e.mpsConnected = map[types.UID]map[string]gpu.MPSServerLimits{}
			}
			if e.mpsConnected[pod.UID] == nil {
				e.mpsConnected[pod.UID] = map[string]gpu.MPSServerLimits{}
			}
			e.mpsConnected[pod.UID][g.UUID] = l
			e.mu.Unlock()
		}
	}
	if e.limiter != nil {
		plan := memlimit.Plan(memlimitPods(pods, claims), e.limitedGPUs())
		if err := e.limiter.ApplyPod(ctx, string(pod.UID), memlimit.ForPod(plan, string(pod.UID))); err != nil {
			return nil, fmt.Errorf("kernel GPU memory limit: %w", err)
		}
	}
	// activePods decoded the starting pod's assignment already.
	i := slices.IndexFunc(pods, func(p activePod) bool { return p.pod.UID == pod.UID })
	if i < 0 {
		return nil, fmt.Errorf("pod %s/%s holds no Tessera assignment for this node", pod.Namespace, pod.Name)
	}
	held := e.guaranteesOf(pod, pods[i].asg)
	var gs []gpu.Guarantee
	for _, sg := range held {
		if sg.Container == c.Name {
			gs = append(gs, sg.Guarantee)
		}
	}
	go e.report(klog.NewContext(context.Background(), klog.FromContext(ctx)), pod, held)
	return gs, nil
}

// claims are the node's prepared DRA claims (none without a driver).
func (e *Enforcer) claims() []gpu.ClaimTenant {
	if e.cfg.Claims == nil {
		return nil
	}
	return e.cfg.Claims()
}

// memlimitPods are the GPUs' tenants as memlimit.Plan takes them: the
// device plugin's pods, then each pod holding claims of its own (one
// "container" per claim), then every claim shared by several pods under
// a name no pod cgroup has. A shared claim gets no kernel limit (there is
// no one cgroup to hold it: the shim holds it), but its grant counts in
// its GPU's total, so the other tenants' soft limits leave it its share.
func memlimitPods(pods []activePod, claims []gpu.ClaimTenant) []memlimit.Pod {
	out := make([]memlimit.Pod, 0, len(pods)+len(claims))
	for _, p := range pods {
		out = append(out, memlimit.Pod{UID: string(p.pod.UID), Assignment: p.asg})
	}
	byPod := map[string]*gpu.PodAssignment{}
	for _, c := range claims {
		uid := c.Pod
		if uid == "" {
			uid = "claim:" + c.Claim // never a cgroup's pod UID
		}
		a := byPod[uid]
		if a == nil {
			a = &gpu.PodAssignment{}
			byPod[uid] = a
			out = append(out, memlimit.Pod{UID: uid, Assignment: a})
		}
		a.Containers = append(a.Containers, c.Assignment)
	}
	return out
}

// IsolateClaim puts a DRA claim's limits in force before its containers
// start (kubelet prepares claims after making the pod's cgroup and before
// its sandbox): its GPUs' MPS server limits, counting it, and, for a claim
// of one pod, that pod's kernel memory limits. It says what holds each of
// the claim's slices (gpu.ClaimOffer). claims are every claim of the node,
// this one included, as the driver holds them while it prepares this one.
// An error refuses the claim; kubelet retries.
func (e *Enforcer) IsolateClaim(ctx context.Context, c gpu.ClaimTenant, claims []gpu.ClaimTenant) ([]gpu.Guarantee, error) {
	pods := e.activePods(nil)
	if c.Assignment.Mode == gpu.ModeMPS && e.cfg.MPS != nil {
		for _, g := range c.Assignment.GPUs {
			if _, err := e.mpsServerLimits(ctx, g.UUID, pods, claims); err != nil {
				return nil, fmt.Errorf("MPS server limits of GPU %s: %w", g.UUID, err)
			}
		}
	}
	if e.limiter != nil && c.Pod != "" {
		plan := memlimit.Plan(memlimitPods(pods, claims), e.limitedGPUs())
		if err := e.limiter.ApplyPod(ctx, c.Pod, memlimit.ForPod(plan, c.Pod)); err != nil {
			return nil, fmt.Errorf("kernel GPU memory limit: %w", err)
		}
	}
	gs := make([]gpu.Guarantee, len(c.Assignment.GPUs))
	for i, g := range c.Assignment.GPUs {
		gs[i] = e.claimGuarantee(c, g)
	}
	if c.Pod != "" {
		// The pod's condition names every claim of it, this one included.
		var held []gpu.SliceGuarantee
		for _, t := range claims {
			if t.Pod == c.Pod {
				held = append(held, e.claimSliceGuarantees(t)...)
			}
		}
		if pod := e.nodePod(types.UID(c.Pod)); pod != nil && len(held) > 0 {
			go e.report(klog.NewContext(context.Background(), klog.FromContext(ctx)), pod, held)
		}
	}
	return gs, nil
}

// claimGuarantee is what holds claim t's slice of GPU grant g: the GPU's
// offer, less the kernel's limits for a claim not of one pod, and MPS
// reported under the whole GPU's server limits (gpu.ClaimOffer).
func (e *Enforcer) claimGuarantee(t gpu.ClaimTenant, g gpu.GPUGrant) gpu.Guarantee {
	reservedFor := 0
	if t.Pod != "" {
		reservedFor = 1
	}
	return gpu.GuaranteeOf(t.Assignment.Mode, g, gpu.ClaimOffer(e.Offer(g.UUID), reservedFor), gpu.MPSServerLimits{ThreadPercent: 100})
}

// claimSliceGuarantees are what holds claim t's slices, per container
// given it (none where the agent did not know its pod).
func (e *Enforcer) claimSliceGuarantees(t gpu.ClaimTenant) []gpu.SliceGuarantee {
	var out []gpu.SliceGuarantee
	for _, ctr := range t.Containers {
		for _, g := range t.Assignment.GPUs {
			out = append(out, gpu.SliceGuarantee{Container: ctr, GPU: g.UUID, Guarantee: e.claimGuarantee(t, g)})
		}
	}
	return out
}

// nodePod is the node's pod uid, nil where the agent does not know it.
func (e *Enforcer) nodePod(uid types.UID) *v1.Pod {
	if e.cfg.NodePods == nil {
		return nil
	}
	for _, p := range e.cfg.NodePods() {
		if p.UID == uid {
			return p
		}
	}
	return nil
}

// guaranteesOf is what holds each slice of a pod. A kernel limit or a
// whole GPU holds whatever happened since the container started (the
// reconciliation keeps the limits); an MPS slice is held by the server
// limits in force when its container connected, which the agent recorded
// then (mpsConnected), or, after the agent restarted, wrote into the pod's
// condition. Without either, it is assumed to have connected under the
// whole GPU's limits: never a claim the agent cannot back.
func (e *Enforcer) guaranteesOf(pod *v1.Pod, asg *gpu.PodAssignment) []gpu.SliceGuarantee {
	var recorded []gpu.SliceGuarantee
	for _, c := range pod.Status.Conditions {
		if c.Type == ConditionGPUIsolation {
			recorded, _ = gpu.ParseSliceGuarantees(c.Message)
		}
	}
	var out []gpu.SliceGuarantee
	for _, c := range asg.Containers {
		for _, g := range c.GPUs {
			server := gpu.MPSServerLimits{ThreadPercent: 100}
			held := gpu.GuaranteeOf(c.Mode, g, e.Offer(g.UUID), server)
			if c.Mode == gpu.ModeMPS {
				if l, ok := e.mpsConnectedUnder(pod.UID, g.UUID); ok {
					held = gpu.GuaranteeOf(c.Mode, g, e.Offer(g.UUID), l)
				} else if i := slices.IndexFunc(recorded, func(r gpu.SliceGuarantee) bool { return r.Container == c.Name && r.GPU == g.UUID }); i >= 0 {
					held = recorded[i].Guarantee
				}
			}
			out = append(out, gpu.SliceGuarantee{Container: c.Name, GPU: g.UUID, Guarantee: held})
		}
	}
	return out
}

// SliceGuarantees is what holds each slice of pod, a pod of this node
// holding GPUs, now (nil for a pod with no assignment here).
func (e *Enforcer) SliceGuarantees(pod *v1.Pod) []gpu.SliceGuarantee {
	asg, err := podgpu.BoundAssignment(pod)
	if err != nil || asg == nil || asg.Node != e.cfg.Node {
		return nil
	}
	return e.guaranteesOf(pod, asg)
}

// mpsConnectedUnder is the GPU's server limits when the pod's container
// started on it, as recorded.
func (e *Enforcer) mpsConnectedUnder(uid types.UID, uuid string) (gpu.MPSServerLimits, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l, ok := e.mpsConnected[uid][uuid]
	return l, ok
}

// isolationCondition is the pod condition for its slices' guarantees.
func isolationCondition(gs []gpu.SliceGuarantee, now time.Time) v1.PodCondition {
	status, reason := v1.ConditionTrue, "Enforced"
	shim := false
	for _, g := range gs {
		if !g.Memory.Enforced() || !g.Compute.Enforced() {
			status, reason = v1.ConditionFalse, "PartlyAccounted"
		}
		shim = shim || gpu.NeedsShim([]gpu.Guarantee{g.Guarantee})
	}
	msg := gpu.FormatSliceGuarantees(gs)
	if status == v1.ConditionFalse {
		msg += " (none: accounted by the scheduler, not held; mps-client: held only for a client that keeps its CUDA_MPS_* variables)"
	} else if shim {
		msg += " (shim: held by libtessera in the container, for every program that uses CUDA's driver API)"
	}
	return v1.PodCondition{Type: ConditionGPUIsolation, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now)}
}

// report sets the pod's GPUIsolation condition, best effort: the
// container has its limits whether or not the API server hears of it.
func (e *Enforcer) report(ctx context.Context, pod *v1.Pod, held []gpu.SliceGuarantee) {
	if e.cfg.Client == nil {
		return
	}
	cond := isolationCondition(held, time.Now())
	for _, c := range pod.Status.Conditions {
		if c.Type == cond.Type && c.Status == cond.Status && c.Message == cond.Message {
			return
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{cond}}})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := e.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		klog.FromContext(ctx).Error(err, "Setting the pod's GPU isolation condition failed", "pod", klog.KObj(pod))
	}
}

// Reconcile follows the GPUs' tenants: every pod cgroup's kernel
// memory limits become the rule's (soft limits change as tenants come and
// go; an ended pod's, or a crashed agent's leftovers, are removed), and each
// MPS GPU's server limits are lowered to what its tenants still need.
func (e *Enforcer) Reconcile(ctx context.Context) {
	e.checkDriver(ctx)
	logger := klog.FromContext(ctx)
	pods, claims := e.activePods(nil), e.claims()
	e.forgetEndedMPSClients(pods)
	if e.cfg.MPS != nil {
		for _, d := range e.cfg.Devices {
			if d.MIGEnabled {
				continue
			}
			if _, err := e.mpsServerLimits(ctx, d.UUID, pods, claims); err != nil {
				logger.Error(err, "Setting MPS server limits failed; retrying at the next pass", "gpu", d.UUID)
			}
		}
	}
	if e.limiter == nil {
		return
	}
	var offering []string
	for _, d := range e.cfg.Devices {
		if e.Offer(d.UUID).KernelMemoryLimits {
			offering = append(offering, d.UUID)
		}
	}
	if len(offering) == 0 {
		return
	}
	res, err := e.limiter.Reconcile(ctx, memlimit.Plan(memlimitPods(pods, claims), e.limitedGPUs()), offering)
	if err != nil && !errors.Is(err, context.Canceled) {
		logger.Error(err, "Reconciling kernel GPU memory limits failed in part; retrying at the next pass")
	}
	if res != (memlimit.Result{}) {
		logger.Info("Kernel GPU memory limits reconciled", "set", res.Set, "updated", res.Updated, "cleared", res.Cleared)
	}
}

// forgetEndedMPSClients drops the connect-time limits of pods no longer
// active.
func (e *Enforcer) forgetEndedMPSClients(pods []activePod) {
	active := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		active[p.pod.UID] = true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid := range e.mpsConnected {
		if !active[uid] {
			delete(e.mpsConnected, uid)
		}
	}
}

// collector exports, per slice and dimension, the mechanism that
// holds it: tessera_slice_isolation{…, dimension, mechanism} 1.
type collector struct{ e *Enforcer }

var sliceIsolationDesc = prometheus.NewDesc("tessera_slice_isolation",
	"What holds each slice, per dimension: device (whole GPU), kernel (NVML cgroup limit), mps-server, mps-client (held only for cooperating clients) or none (accounted only). Always 1.",
	append(append([]string{}, gpu.TenantSeriesLabels...), "dimension", "mechanism"), nil)

// The grants, per container and GPU, for the tenants' usage
// (tessera_container_gpu_*_used) to be read against.
var (
	grantedMemoryDesc = prometheus.NewDesc("tessera_container_gpu_memory_granted_bytes",
		"GPU memory granted to a container on one GPU by its assignment (a whole GPU: the GPU's memory).",
		gpu.TenantSeriesLabels, nil)
	grantedCoresDesc = prometheus.NewDesc("tessera_container_gpu_cores_granted_ratio",
		"Share of one GPU's SMs granted to a container by its assignment, 0-1.",
		gpu.TenantSeriesLabels, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sliceIsolationDesc
	ch <- grantedMemoryDesc
	ch <- grantedCoresDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.collectClaims(ch)
	for _, p := range c.e.activePods(nil) {
		for _, ctr := range p.asg.Containers {
			for _, g := range ctr.GPUs {
				l := c.e.cfg.Labels(g.UUID, p.pod.Namespace, p.pod.Name, ctr.Name)
				ch <- prometheus.MustNewConstMetric(grantedMemoryDesc, prometheus.GaugeValue, float64(g.MemoryMiB)*(1<<20), l...)
				ch <- prometheus.MustNewConstMetric(grantedCoresDesc, prometheus.GaugeValue, float64(g.CoresPerMille)/gpu.CoresPerGPU, l...)
			}
		}
		for _, g := range c.e.guaranteesOf(p.pod, p.asg) {
			for dim, m := range map[string]gpu.Mechanism{"memory": g.Memory, "compute": g.Compute} {
				ch <- prometheus.MustNewConstMetric(sliceIsolationDesc, prometheus.GaugeValue, 1,
					c.e.cfg.Labels(g.GPU, p.pod.Namespace, p.pod.Name, g.Container, dim, string(m))...)
			}
		}
	}
}

// collectClaims exports the claims' grants and what holds them, per
// container given each claim (a claim given to several containers shows
// its grant on each: they share it). Two claims of one container on one
// GPU are one series, their grants summed.
func (c collector) collectClaims(ch chan<- prometheus.Metric) {
	type key struct{ uuid, ns, pod, ctr string }
	type slice struct {
		memMiB int64
		cores  int
		held   gpu.Guarantee
	}
	byKey := map[key]*slice{}
	var order []key
	for _, t := range c.e.claims() {
		if t.PodName == "" {
			continue
		}
		for _, ctr := range t.Containers {
			for _, g := range t.Assignment.GPUs {
				k := key{g.UUID, t.Namespace, t.PodName, ctr}
				s := byKey[k]
				if s == nil {
					s = &slice{held: c.e.claimGuarantee(t, g)}
					byKey[k] = s
					order = append(order, k)
				}
				s.memMiB += g.MemoryMiB
				s.cores += g.CoresPerMille
			}
		}
	}
	for _, k := range order {
		s := byKey[k]
		l := c.e.cfg.Labels(k.uuid, k.ns, k.pod, k.ctr)
		ch <- prometheus.MustNewConstMetric(grantedMemoryDesc, prometheus.GaugeValue, float64(s.memMiB)*(1<<20), l...)
		ch <- prometheus.MustNewConstMetric(grantedCoresDesc, prometheus.GaugeValue, float64(s.cores)/gpu.CoresPerGPU, l...)
		for dim, m := range map[string]gpu.Mechanism{"memory": s.held.Memory, "compute": s.held.Compute} {
			ch <- prometheus.MustNewConstMetric(sliceIsolationDesc, prometheus.GaugeValue, 1, c.e.cfg.Labels(k.uuid, k.ns, k.pod, k.ctr, dim, string(m))...)
		}
	}
}
