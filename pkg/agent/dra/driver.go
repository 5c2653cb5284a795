package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/shim"
	"github.com/tessera-gpu/tessera/pkg/allocator"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// CDIKind is the CDI vendor/class of prepared claims: a claim's containers
// get "tessera.dev/claim=<claim UID>". It is not the device plugin's kind,
// whose collection of slot specs therefore never touches a claim's.
const CDIKind = "tessera.dev/claim"

// SpecPath is where a claim's CDI spec lives.
func SpecPath(cdiDir string, claim types.UID) string {
	return filepath.Join(cdiDir, "tessera-claim-"+string(claim)+".json")
}

// Inventory is the node's inventory as last published.
type Inventory interface {
	Published() *gpu.NodeInventory
}

// DriverEditor gives the driver's part of a container (its GPUs' device
// nodes, libraries, hooks): the agent's isolation.Enforcer.
type DriverEditor interface {
	DriverEdits(uuids []string) (*specs.ContainerEdits, error)
}

// Isolator puts a claim's limits in force before its containers start and
// says what holds its slices: the agent's isolation.Enforcer.
type Isolator interface {
	IsolateClaim(ctx context.Context, c gpu.ClaimTenant, claims []gpu.ClaimTenant) ([]gpu.Guarantee, error)
}

// Config is what a Driver needs.
type Config struct {
	Node string
	// CDIDir is where claims' CDI specs are written (/var/run/cdi).
	CDIDir string
	// StateDir keeps the checkpoint of prepared claims; it must survive an
	// agent restart (a host directory).
	StateDir string
	// Inventory gives the GPUs a claim's devices are checked against.
	Inventory Inventory
	// PipeDir is a GPU's MPS pipe directory on the host.
	PipeDir deviceplugin.PipeDir
	// DriverEdits, when set, gives the driver's edits for a claim's GPUs.
	DriverEdits DriverEditor
	// Isolator, when set, puts each claim's limits in force (the MPS
	// server's, the kernel's memory limits for a claim of one pod) and
	// says what holds it; without it a claim's slices are held by what
	// needs no agent-set limit (the device, the shim, MPS's variables).
	Isolator Isolator
	// Shim, when set, puts libtessera into the containers of claims whose
	// slices it holds; a claim that needs it on an agent without it is
	// refused.
	Shim *shim.Dir
	// HealthEvery is how often device health is reported to kubelet when
	// nothing changed (10 s when zero; kubelet's own timeout is 30 s).
	HealthEvery time.Duration
	// MemoryOversubscription is the allocator's: Σ memory of a GPU's
	// tenants ≤ its memory × this (1 when zero).
	MemoryOversubscription float64
	// Pods, when set, returns a pod of this node by namespace and name
	// (the agent's informer): a claim is prepared only for pods it is
	// reserved for that the agent knows and that cannot leave their slice
	// (podgpu.EscapesSlice).
	Pods func(namespace, name string) *v1.Pod
	// NoticeDir, when set, gives the containers of a claim reserved for
	// one pod that pod's preemption notice directory, as the device plugin
	// gives GPU containers (the claim's spec is written for that pod).
	NoticeDir deviceplugin.NoticeDir
	// SchedulerNames are the scheduler profiles that run TesseraGPU
	// (deviceplugin.DefaultSchedulerNames when empty): a claim reserved
	// for a pod naming another scheduler is refused (ErrNotTesseraScheduled),
	// checked where Pods is set.
	SchedulerNames []string
	// Reclaiming, when set, names a preempted pod whose leftover processes
	// may still hold one of the GPUs (nodepreempt.Preemptor.Reclaiming): a
	// claim is not prepared there until the agent has reclaimed them.
	Reclaiming func(gpus []string) (victim string, busy bool)
	// Booked, when set, gives the assignments of this node's pods placed
	// through the device plugin that still hold GPUs: a claim is checked
	// against them and the claims prepared before it.
	Booked func() []*gpu.PodAssignment
}

// Driver is the DRA driver's node side: kubeletplugin.DRAPlugin.
type Driver struct {
	cfg Config

	// mu guards claims and the checkpoint file: Prepare and Unprepare of
	// different claims may run at once (the helper serializes gRPC calls
	// by default, but nothing here relies on it).
	mu     sync.Mutex
	claims map[types.UID]*preparedClaim

	// healthMu guards changed, closed and replaced when the inventory's
	// health may have changed.
	healthMu sync.Mutex
	changed  chan struct{}

	refusals *prometheus.CounterVec
	prepared prometheus.GaugeFunc
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New is a driver with the claims its checkpoint holds. A checkpoint it
// cannot read is an error: claims it recorded could not be unprepared.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" || cfg.CDIDir == "" || cfg.Inventory == nil {
		return nil, errors.New("DRA driver: a state directory, a CDI directory and the inventory are required")
	}
	if cfg.PipeDir == nil {
		cfg.PipeDir = func(string) string { return "" }
	}
	if cfg.HealthEvery <= 0 {
		cfg.HealthEvery = 10 * time.Second
	}
	if cfg.MemoryOversubscription < 1 {
		cfg.MemoryOversubscription = 1
	}
	claims, err := loadCheckpoint(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	d := &Driver{cfg: cfg, claims: claims, changed: make(chan struct{})}
	d.newMetrics()
	return d, nil
}

// Prepared returns the UIDs of the claims prepared (or being prepared),
// sorted.
func (d *Driver) Prepared() []types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]types.UID, 0, len(d.claims))
	for uid := range d.claims {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out
}

// Assignments returns, per prepared claim, its assignment on this node's
// GPUs (one container's: every container given the claim shares it), for
// the agent's slice counts.
func (d *Driver) Assignments() []gpu.ContainerAssignment {
	var out []gpu.ContainerAssignment
	for _, t := range d.Tenants() {
		out = append(out, t.Assignment)
	}
	return out
}

// Tenants returns the prepared claims as tenants of their GPUs, sorted by
// claim UID, for the node's isolation (the MPS server's and the kernel's
// limits count them) and preemption's reclaim.
func (d *Driver) Tenants() []gpu.ClaimTenant {
	inv := d.cfg.Inventory.Published()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tenantsLocked(inv)
}

// GPUsByPod returns the GPUs of the prepared claims reserved for one pod,
// per pod: preemption's reclaim looks for a victim's leftover processes
// there (a claim holder's GPUs are not in its pod). A claim several pods
// share is left out: evicting one of them frees nothing.
func (d *Driver) GPUsByPod() map[types.UID][]string {
	out := map[types.UID][]string{}
	for _, t := range d.Tenants() {
		if t.Pod == "" {
			continue
		}
		for _, g := range t.Assignment.GPUs {
			if !slices.Contains(out[types.UID(t.Pod)], g.UUID) {
				out[types.UID(t.Pod)] = append(out[types.UID(t.Pod)], g.UUID)
			}
		}
	}
	return out
}

func (d *Driver) tenantsLocked(inv *gpu.NodeInventory) []gpu.ClaimTenant {
	var out []gpu.ClaimTenant
	for _, uid := range slices.Sorted(maps.Keys(d.claims)) {
		rec := d.claims[uid]
		if rec.State != statePrepared {
			continue
		}
		if a, err := assignmentOn(inv, d.cfg.Node, rec.Name, rec.Devices); err == nil {
			out = append(out, gpu.ClaimTenant{Claim: string(uid), Pod: string(rec.Pod), Namespace: rec.Namespace, PodName: rec.PodName,
				Containers: rec.Containers, Assignment: a})
		}
	}
	return out
}

// PrepareResourceClaims prepares each claim on its own: one claim's
// failure is its own answer, never another's.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(c), "claimUID", c.UID)
		devices, err := d.prepare(klog.NewContext(ctx, logger), c)
		if err != nil {
			logger.Error(err, "Refusing to prepare the claim")
			d.refusals.WithLabelValues(d.cfg.Node, refusalReason(err)).Inc()
			out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)}
			continue
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

// ErrCapacityMissing: an allocation of a shared GPU that does not say how
// much of it the claim took. The agent does not guess (the scheduler that
// allocated it ran without consumable capacity), so the claim is refused.
var ErrCapacityMissing = errors.New("the allocation does not say how much of the GPU the claim consumed (consumable capacity off in the scheduler that allocated it?); refused rather than guessed")

// prepare prepares one claim: its devices checked against the node's GPUs,
// its edits and limits (as the device plugin's), its CDI spec, and the
// checkpoint before and after.
func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, errors.New("the claim is not allocated")
	}
	var mine []allocatedDevice
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		a := allocatedDevice{Request: r.Request, Pool: r.Pool, Device: r.Device}
		if r.ShareID != nil {
			a.ShareID = string(*r.ShareID)
		}
		mem, okMem := r.ConsumedCapacity[CapacityMemory]
		cores, okCores := r.ConsumedCapacity[CapacityCores]
		if !okMem || !okCores {
			return nil, fmt.Errorf("device %s/%s: %w", r.Pool, r.Device, ErrCapacityMissing)
		}
		a.MemoryMiB, a.Cores = mebibytesUp(mem), cores.Value()
		cfg, err := configFor(c.Status.Allocation, r.Request)
		if err != nil {
			return nil, err
		}
		if cfg.Whole && a.Cores < 100 {
			return nil, fmt.Errorf("request %s's class asks for whole GPUs, but it consumed %d %% of %s's cores: ask no capacity in this class, or use %s for a slice",
				r.Request, a.Cores, r.Device, DriverName)
		}
		mine = append(mine, a)
	}
	if len(mine) == 0 {
		return nil, nil // nothing of ours in it
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if prev, ok := d.claims[c.UID]; ok && prev.State == statePrepared && slices.Equal(prev.Devices, mine) {
		return answer(prev), nil // kubelet asks again (a restart): same answer
	}
	if err := d.podsKeepTheirSlice(c); err != nil {
		return nil, err
	}
	// One look at the node's GPUs for the whole decision.
	inv := d.cfg.Inventory.Published()
	assignment, err := assignmentOn(inv, d.cfg.Node, c.Name, mine)
	if err != nil {
		return nil, err
	}
	if err := d.honoured(inv, c.UID, assignment); err != nil {
		return nil, err
	}
	uuids := make([]string, len(assignment.GPUs))
	for i, g := range assignment.GPUs {
		uuids[i] = g.UUID
	}
	if d.cfg.Reclaiming != nil {
		if victim, busy := d.cfg.Reclaiming(uuids); busy {
			return nil, fmt.Errorf("%w: %s may have left processes there, which the agent kills before the claim's containers start; kubelet retries", ErrReclaiming, victim)
		}
	}
	e, err := deviceplugin.EditsFor(assignment, d.cfg.PipeDir)
	if err != nil {
		return nil, err
	}
	if d.cfg.DriverEdits != nil {
		if e.Driver, err = d.cfg.DriverEdits.DriverEdits(uuids); err != nil {
			return nil, fmt.Errorf("the driver's files and device nodes for GPUs %v: %w", uuids, err)
		}
	}
	var pod types.UID // the claim's one pod; none when shared
	var podName string
	var containers []string
	if ref := onlyPod(c); ref != nil {
		pod = ref.UID
		if d.cfg.Pods != nil {
			if known := d.cfg.Pods(c.Namespace, ref.Name); known != nil && known.UID == ref.UID {
				podName, containers = known.Name, ContainersGiven(known, c.Name)
			}
		}
	}
	tenant := gpu.ClaimTenant{Claim: string(c.UID), Pod: string(pod), Namespace: c.Namespace, PodName: podName, Containers: containers, Assignment: assignment}
	if d.cfg.Isolator != nil {
		// Its limits go in force before anything is recorded: a refusal
		// leaves no file, and the reconciliation takes back limits set
		// for a claim that was not prepared.
		if e.Guarantees, err = d.cfg.Isolator.IsolateClaim(ctx, tenant, append(d.tenantsLocked(inv), tenant)); err != nil {
			return nil, err
		}
	} else {
		for _, g := range assignment.GPUs {
			dev := gpuByUUID(inv, g.UUID)
			e.Guarantees = append(e.Guarantees, gpu.GuaranteeOf(assignment.Mode, g, gpu.ClaimOffer(dev.Offer(), 0), gpu.MPSServerLimits{ThreadPercent: 100}))
		}
	}
	e.Env = append(e.Env, deviceplugin.IsolationEnv+"="+deviceplugin.IsolationValue(e.Guarantees))
	rec := &preparedClaim{Namespace: c.Namespace, Name: c.Name, State: statePreparing, Devices: mine, CDIDevice: CDIKind + "=" + string(c.UID),
		Shim: gpu.NeedsShim(e.Guarantees), Pod: pod, PodName: podName, Containers: containers}
	if rec.Shim && d.cfg.Shim == nil {
		return nil, errors.New("its slices are held by libtessera, which this agent was not given (--shim-dir)")
	}
	// Recorded before any file is written: an Unprepare after a crash
	// here knows what to remove.
	d.claims[c.UID] = rec
	if err := saveCheckpoint(d.cfg.StateDir, d.claims); err != nil {
		delete(d.claims, c.UID)
		return nil, fmt.Errorf("recording the claim in the DRA checkpoint: %w", err)
	}
	if rec.Shim {
		mounts, err := d.cfg.Shim.PrepareClaim(string(c.UID), shim.Limits(assignment))
		if err != nil {
			return nil, fmt.Errorf("putting libtessera in the claim's containers: %w", err)
		}
		for _, m := range mounts {
			opt := "rw"
			if m.ReadOnly {
				opt = "ro"
			}
			e.Mounts = append(e.Mounts, deviceplugin.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: []string{"rbind", opt}})
		}
	}
	if pod != "" && d.cfg.NoticeDir != nil {
		// The preemption contract: the notice appears here, and the
		// workload reports its checkpoint here.
		dir := d.cfg.NoticeDir(string(pod))
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return nil, fmt.Errorf("preemption notice directory: %w", err)
		}
		e.Mounts = append(e.Mounts, deviceplugin.Mount{HostPath: dir, ContainerPath: preemption.ContainerDir, Options: []string{"rbind", "rw"}})
	}
	if err := deviceplugin.WriteDeviceSpec(SpecPath(d.cfg.CDIDir, c.UID), CDIKind, string(c.UID), e); err != nil {
		return nil, fmt.Errorf("writing the claim's CDI spec: %w", err)
	}
	rec.State = statePrepared
	if err := saveCheckpoint(d.cfg.StateDir, d.claims); err != nil {
		return nil, fmt.Errorf("recording the prepared claim in the DRA checkpoint: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Claim prepared", "mode", assignment.Mode, "gpus", uuids, "env", e.Env, "isolation", deviceplugin.IsolationValue(e.Guarantees))
	return answer(rec), nil
}

// ContainersGiven are the containers of pod (init containers first) given
// the ResourceClaim named claim, through the pod's claim entry that
// resolves to it (a claim named directly, or one made from a template,
// named in the pod's status).
func ContainersGiven(pod *v1.Pod, claim string) []string {
	var entry string
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		if pc.ResourceClaimName != nil && *pc.ResourceClaimName == claim {
			entry = pc.Name
		}
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil && *st.ResourceClaimName == claim {
			entry = st.Name
		}
	}
	if entry == "" {
		return nil
	}
	var out []string
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if slices.ContainsFunc(c.Resources.Claims, func(r v1.ResourceClaim) bool { return r.Name == entry }) {
				out = append(out, c.Name)
			}
		}
	}
	return out
}

// onlyPod is the one pod a claim is reserved for, nil where it is
// reserved for none or several.
func onlyPod(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaimConsumerReference {
	var only *resourceapi.ResourceClaimConsumerReference
	for i, r := range c.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			continue
		}
		if only != nil {
			return nil
		}
		only = &c.Status.ReservedFor[i]
	}
	return only
}

// assignmentOn is the claim's devices as one container's assignment on
// node's GPUs inv (every container given the claim shares it), checked
// against them.
func assignmentOn(inv *gpu.NodeInventory, node, claim string, devices []allocatedDevice) (gpu.ContainerAssignment, error) {
	if inv == nil {
		return gpu.ContainerAssignment{}, errors.New("the agent has not read this node's GPUs yet; kubelet retries")
	}
	a := gpu.ContainerAssignment{Name: "claim-" + claim}
	for i, r := range devices {
		if r.Pool != node {
			return a, fmt.Errorf("device %s is in pool %q, not this node's (%q)", r.Device, r.Pool, node)
		}
		g := gpuByDevice(inv, r.Device)
		if g == nil {
			return a, fmt.Errorf("device %s: no such GPU on this node", r.Device)
		}
		if !g.Healthy {
			return a, fmt.Errorf("device %s (GPU %s) is unhealthy", r.Device, g.UUID)
		}
		if slices.ContainsFunc(a.GPUs, func(x gpu.GPUGrant) bool { return x.UUID == g.UUID }) {
			return a, fmt.Errorf("device %s is allocated to the claim twice", r.Device)
		}
		mode, grant, err := grantOf(*g, r.MemoryMiB, r.Cores)
		if err != nil {
			return a, fmt.Errorf("device %s: %w", r.Device, err)
		}
		if i > 0 && mode != a.Mode {
			return a, fmt.Errorf("device %s would run %s while %s runs %s: a claim's GPUs are all whole or all shared alike", r.Device, mode, devices[0].Device, a.Mode)
		}
		a.Mode = mode
		a.GPUs = append(a.GPUs, grant)
	}
	return a, nil
}

// ErrLeavesSlice says a pod a claim is reserved for could leave the slice
// the claim gives it (privileged, host namespaces, the GPUs' variables, a
// guarded host path): the claim is not prepared, so the pod does not start.
var ErrLeavesSlice = errors.New("a pod the claim is reserved for could leave its GPU slice")

// ErrNotTesseraScheduled says a pod a claim is reserved for names a
// scheduler that does not run TesseraGPU: another allocator chose its
// GPU (first fit, from its own view of what is free), so the claim is not
// prepared.
var ErrNotTesseraScheduled = errors.New("a pod the claim is reserved for was not scheduled by a Tessera profile")

// ErrReclaiming: the claim's GPU may still hold a preempted pod's leftover
// processes; the agent kills them first, and kubelet's retry prepares it.
var ErrReclaiming = errors.New("its GPU is still being reclaimed from a preempted pod")

func (d *Driver) schedulers() []string {
	if len(d.cfg.SchedulerNames) == 0 {
		return deviceplugin.DefaultSchedulerNames
	}
	return d.cfg.SchedulerNames
}

// podsKeepTheirSlice checks every pod the claim is reserved for: known
// to the agent, scheduled by a Tessera profile, unable to leave its slice.
func (d *Driver) podsKeepTheirSlice(c *resourceapi.ResourceClaim) error {
	if d.cfg.Pods == nil {
		return nil
	}
	for _, r := range c.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			continue
		}
		p := d.cfg.Pods(c.Namespace, r.Name)
		if p == nil || p.UID != r.UID {
			return fmt.Errorf("pod %s/%s, which the claim is reserved for, is not known to this node's agent yet; kubelet retries", c.Namespace, r.Name)
		}
		if !slices.Contains(d.schedulers(), p.Spec.SchedulerName) {
			return fmt.Errorf("%w: pod %s/%s names spec.schedulerName %q; set it to %s, which places gpu.tessera.dev claims on the GPU the fragmentation gradient picks and counts them with the device plugin's pods",
				ErrNotTesseraScheduled, c.Namespace, r.Name, p.Spec.SchedulerName, strings.Join(d.schedulers(), " or "))
		}
		if why := podgpu.EscapesSlice(p); len(why) > 0 {
			return fmt.Errorf("%w: pod %s/%s: %s; remove them (the same rules as the admission policy tessera-gpu-pod-limits)", ErrLeavesSlice, c.Namespace, r.Name, strings.Join(why, "; "))
		}
	}
	return nil
}

// ErrOvercommitted says a claim's allocation, counted with the claims
// prepared before it and the device plugin's pods, asks more of a GPU than
// it has: two allocators booked the same capacity (two schedulers running
// DynamicResources, each with its own view), or a scheduler without
// consumable capacity. The driver is the last line of defense, so the
// newcomer is refused and the tenants before it keep their GPUs.
var ErrOvercommitted = errors.New("this node cannot honour the claim's allocation")

// honoured checks a claim's assignment against the node's GPUs and what
// they hold (the device plugin's pods, then the claims prepared before it
// in UID order) with the scheduler's own rules (allocator.Node: Σ cores ≤
// 100 %, Σ memory ≤ memory × oversubscription, one sharing mode per GPU).
func (d *Driver) honoured(inv *gpu.NodeInventory, uid types.UID, a gpu.ContainerAssignment) error {
	node, err := allocator.NewNode(inv)
	if err != nil {
		return fmt.Errorf("the agent's own inventory: %w", err)
	}
	oversub := d.cfg.MemoryOversubscription
	if d.cfg.Booked != nil {
		for _, b := range d.cfg.Booked() {
			// Honoured by the device plugin when they started; one that
			// no longer fits (a GPU lost) still counts what it can.
			_ = node.AddAssignment(b, 0, 0, oversub)
		}
	}
	uids := make([]types.UID, 0, len(d.claims))
	for u, rec := range d.claims {
		if u != uid && rec.State == statePrepared {
			uids = append(uids, u)
		}
	}
	slices.Sort(uids)
	for _, u := range uids {
		prev, err := assignmentOn(inv, d.cfg.Node, d.claims[u].Name, d.claims[u].Devices)
		if err != nil {
			continue // its GPU gone or unhealthy: nothing of it to count
		}
		_ = node.AddAssignment(&gpu.PodAssignment{Node: inv.Node, Containers: []gpu.ContainerAssignment{prev}}, 0, 0, oversub)
	}
	if err := node.AddAssignment(&gpu.PodAssignment{Node: inv.Node, Containers: []gpu.ContainerAssignment{a}}, 0, 0, oversub); err != nil {
		return fmt.Errorf("%w, counting the claims prepared and the device plugin's pods on it before: %v", ErrOvercommitted, err)
	}
	return nil
}

// answer is what kubelet is told of a prepared claim: its CDI device for
// every request (kubelet gives each container the devices of the requests
// it names), listed once, on the first device; the others are named for
// the record.
func answer(rec *preparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, len(rec.Devices))
	for i, r := range rec.Devices {
		out[i] = kubeletplugin.Device{PoolName: r.Pool, DeviceName: r.Device, Requests: []string{r.Request}}
		if r.ShareID != "" {
			id := types.UID(r.ShareID)
			out[i].ShareID = &id
		}
	}
	out[0].Requests = nil // every request's containers
	out[0].CDIDeviceIDs = []string{rec.CDIDevice}
	return out
}

// UnprepareResourceClaims removes each claim's files and its record; a
// claim never prepared (or already unprepared) is no error.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range claims {
		out[c.UID] = d.unprepare(ctx, c)
	}
	return out, nil
}

func (d *Driver) unprepare(ctx context.Context, c kubeletplugin.NamespacedObject) error {
	rec, ok := d.claims[c.UID]
	if !ok {
		return nil
	}
	if err := removeIfThere(SpecPath(d.cfg.CDIDir, c.UID)); err != nil {
		return fmt.Errorf("claim %s: removing its CDI spec: %w", c, err)
	}
	if rec.Shim && d.cfg.Shim != nil {
		if err := d.cfg.Shim.ReleaseClaim(string(c.UID)); err != nil {
			return fmt.Errorf("claim %s: removing its libtessera directory: %w", c, err)
		}
	}
	delete(d.claims, c.UID)
	if err := saveCheckpoint(d.cfg.StateDir, d.claims); err != nil {
		d.claims[c.UID] = rec
		return fmt.Errorf("claim %s: recording it unprepared: %w", c, err)
	}
	klog.FromContext(ctx).V(2).Info("Claim unprepared", "claim", c.String())
	return nil
}

// HandleError logs the helper's background errors (publishing the
// ResourceSlice): every one is retried, none ends the agent.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
}

// InventoryChanged tells the health watch to report at once.
func (d *Driver) InventoryChanged() {
	d.healthMu.Lock()
	defer d.healthMu.Unlock()
	close(d.changed)
	d.changed = make(chan struct{})
}

// WatchHealthStatus reports every GPU's health to kubelet, at once on a
// change and every HealthEvery otherwise.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	for {
		d.healthMu.Lock()
		changed := d.changed
		d.healthMu.Unlock()
		report := kubeletplugin.DeviceHealthReport{}
		now := time.Now()
		if inv := d.cfg.Inventory.Published(); inv != nil {
			for _, g := range inv.GPUs {
				h := kubeletplugin.HealthStatusHealthy
				if !g.Healthy {
					h = kubeletplugin.HealthStatusUnhealthy
				}
				report.Devices = append(report.Devices, kubeletplugin.DeviceHealth{PoolName: d.cfg.Node, DeviceName: gpu.DRADeviceName(g.Index),
					Health: h, LastUpdated: now, HealthCheckTimeout: 3 * d.cfg.HealthEvery})
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(d.cfg.HealthEvery):
		}
	}
}

func gpuByDevice(inv *gpu.NodeInventory, device string) *gpu.Device {
	for i := range inv.GPUs {
		if gpu.DRADeviceName(inv.GPUs[i].Index) == device {
			return &inv.GPUs[i]
		}
	}
	return nil
}

func gpuByUUID(inv *gpu.NodeInventory, uuid string) *gpu.Device {
	for i := range inv.GPUs {
		if inv.GPUs[i].UUID == uuid {
			return &inv.GPUs[i]
		}
	}
	return &gpu.Device{UUID: uuid}
}

func removeIfThere(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
