// Package deviceplugin is the agent's kubelet device plugin (API v1beta1) for
// tessera.dev/gpu.
//
// Kubelet's Allocate names devices, not the pod they are for, and several
// pods bound to one node are admitted in an order the agent cannot know. So
// the plugin does not guess. Its devices are slots — interchangeable tokens
// of GPU capacity, as many per GPU as the GPU has slices — and the identity
// of their holder comes from kubelet itself:
//
//  1. Allocate answers, for each slot, the CDI device tessera.dev/gpu=<slot>;
//     nothing in that answer depends on the pod.
//  2. PreStartContainer (required at registration) runs after kubelet has
//     recorded which container holds which slots and before the container is
//     created. The plugin asks kubelet's pod-resources API which container
//     holds exactly these slots, reads that pod's assignment (written by the
//     scheduler at bind, which users cannot forge past it), and writes the
//     CDI spec of the slots: the assigned GPUs and, for MPS clients, the pipe
//     directory and the per-client thread and memory limits.
//  3. The runtime resolves tessera.dev/gpu=<slot> from that spec when it
//     creates the container.
//
// No step takes a lock across pods: 50 pods bound at once are 50 independent
// lookups. A container whose slots match no assignment fails PreStartContainer
// with a reason kubelet shows on the pod, and never starts with a guessed GPU.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/pkg/agent/shim"
	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/preemption"
)

// ResourceName is the extended resource the plugin serves.
const ResourceName = gpu.ResourceGPU

// GPUSlots is one GPU as advertised: its slots and whether it takes work.
type GPUSlots struct {
	UUID    string
	Slices  int
	Healthy bool
}

// SlotID names slot k of a GPU.
func SlotID(uuid string, k int) string { return fmt.Sprintf("%s-s%d", uuid, k) }

// Holder says which container kubelet has given a set of device IDs: the
// agent asks kubelet's pod-resources API.
type Holder interface {
	// HolderOf returns the namespace, pod and container name holding
	// exactly these IDs of resource.
	HolderOf(ctx context.Context, resource string, ids []string) (namespace, pod, container string, err error)
	// Held returns every device ID of resource some container holds.
	Held(ctx context.Context, resource string) (map[string]bool, error)
}

// Pods returns a pod of this node by namespace and name (the agent's
// informer), or nil.
type Pods func(namespace, name string) *v1.Pod

// Inventory is the node's inventory as last published (publish.Publisher):
// the GPUs every assignment is checked against.
type Inventory interface {
	Published() *gpu.NodeInventory
}

// Reporter hears every PreStartContainer answer whose pod is known
// (refusal.Tracker): err nil when the container got its GPUs, else why it
// was refused. A refused pod keeps its slots in kubelet until it is
// deleted.
type Reporter interface {
	PreStarted(pod *v1.Pod, container string, slots int, err error)
}

// NoticeDir is the host directory of a pod's preemption notices, mounted
// into its GPU containers at preemption.ContainerDir.
type NoticeDir func(podUID string) string

// Plugin is the device plugin. Create it with New.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	node       string
	schedulers []string
	holder     Holder
	pods       Pods
	pipeDir    PipeDir
	cdiDir     string
	noticeDir  NoticeDir
	inventory  Inventory
	nodePods   func() []*v1.Pod
	oversub    float64
	reporter   Reporter
	enforcer   Enforcer
	shim       *shim.Dir

	mu      sync.Mutex
	gpus    []GPUSlots
	version uint64
	changed chan struct{} // closed and replaced on every change
}

// Config is what a Plugin needs.
type Config struct {
	Node string
	// SchedulerNames are the scheduler profiles that run TesseraGPU
	// (DefaultSchedulerNames when empty): an assignment on a pod naming
	// another scheduler is not trusted.
	SchedulerNames []string
	Holder         Holder
	Pods           Pods
	PipeDir        PipeDir
	// CDIDir is where slot specs are written (/var/run/cdi on a node).
	CDIDir string
	// NoticeDir, when set, gives every GPU container its pod's preemption
	// notice directory.
	NoticeDir NoticeDir
	// Inventory and NodePods, when set, have every assignment checked
	// against the node's GPUs and what its pods were granted before
	// (Honoured), with MemoryOversubscription as the per-GPU memory limit.
	Inventory              Inventory
	NodePods               func() []*v1.Pod
	MemoryOversubscription float64
	// Reporter, when set, is told of every PreStartContainer whose pod is
	// known.
	Reporter Reporter
	// Enforcer, when set, puts in force the limits of a container about to
	// get its GPUs before its spec is written, and gives the driver's
	// edits for its GPUs, written into its spec.
	Enforcer Enforcer
	// Shim, when set, puts libtessera into the containers of slices the
	// Enforcer says it holds (gpu.MechanismShim).
	Shim *shim.Dir
}

// Enforcer holds a container to its slices: the agent's
// isolation.Enforcer.
type Enforcer interface {
	// Isolate puts in force the limits of a container about to get its
	// GPUs — kernel memory limits, MPS server limits — and returns, per GPU
	// of c in order, what holds its slice. An error refuses the container:
	// it never runs with a limit that could not be set.
	Isolate(ctx context.Context, pod *v1.Pod, c gpu.ContainerAssignment) ([]gpu.Guarantee, error)
	// DriverEdits returns the driver's edits for a container with these
	// GPUs (their device nodes, the control nodes, libraries, hooks), so
	// that its GPUs are exactly its assignment and do not rest on
	// NVIDIA_VISIBLE_DEVICES and a runtime hook honouring it; nil where
	// there are none.
	DriverEdits(uuids []string) (*specs.ContainerEdits, error)
}

// DefaultSchedulerNames is tessera-scheduler's shipped profile
// (deploy/scheduler-config.yaml).
var DefaultSchedulerNames = []string{"tessera-scheduler"}

// New returns a plugin advertising nothing until SetGPUs.
func New(c Config) *Plugin {
	schedulers := c.SchedulerNames
	if len(schedulers) == 0 {
		schedulers = DefaultSchedulerNames
	}
	return &Plugin{node: c.Node, schedulers: schedulers, holder: c.Holder, pods: c.Pods, pipeDir: c.PipeDir, cdiDir: c.CDIDir, noticeDir: c.NoticeDir,
		inventory: c.Inventory, nodePods: c.NodePods, oversub: c.MemoryOversubscription, reporter: c.Reporter, enforcer: c.Enforcer, shim: c.Shim,
		changed: make(chan struct{})}
}

// SetGPUs replaces what is advertised; ListAndWatch streams the change to
// kubelet at once (a faulted GPU's slots turn unhealthy together).
func (p *Plugin) SetGPUs(gpus []GPUSlots) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gpus = slices.Clone(gpus)
	p.version++
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Plugin) devices() ([]*pluginapi.Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*pluginapi.Device
	for _, g := range p.gpus {
		health := pluginapi.Healthy
		if !g.Healthy {
			health = pluginapi.Unhealthy
		}
		for k := range g.Slices {
			out = append(out, &pluginapi.Device{ID: SlotID(g.UUID, k), Health: health})
		}
	}
	return out, p.changed
}

// Options is what the plugin registers with: PreStartContainer is where the
// container's holder is known.
func Options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions implements the device plugin API.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return Options(), nil
}

// ListAndWatch streams the slots, again on every change, until kubelet hangs
// up.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		devs, changed := p.devices()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation: slots are interchangeable tokens (the GPU comes
// from the assignment at PreStartContainer), so any choice is correct. It
// takes the required slots, then slots of the GPUs with the most free ones,
// lowest IDs first: deterministic, and spreading kubelet's tokens so that a
// GPU turning unhealthy takes as few held slots with it as possible.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		chosen := slices.Clone(cr.MustIncludeDeviceIDs)
		free := map[string][]string{} // GPU → available slots
		for _, id := range cr.AvailableDeviceIDs {
			if slices.Contains(chosen, id) {
				continue
			}
			g := gpuOf(id)
			free[g] = append(free[g], id)
		}
		gpus := make([]string, 0, len(free))
		for g := range free {
			gpus = append(gpus, g)
			sort.Strings(free[g])
		}
		sort.Slice(gpus, func(i, j int) bool {
			if len(free[gpus[i]]) != len(free[gpus[j]]) {
				return len(free[gpus[i]]) > len(free[gpus[j]])
			}
			return gpus[i] < gpus[j]
		})
		for _, g := range gpus {
			for _, id := range free[g] {
				if len(chosen) >= int(cr.AllocationSize) {
					break
				}
				chosen = append(chosen, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return resp, nil
}

func gpuOf(slot string) string {
	if i := strings.LastIndex(slot, "-s"); i > 0 {
		return slot[:i]
	}
	return slot
}

// Allocate answers each container's slots with their CDI names; what the
// names resolve to is written at PreStartContainer, when the holder is known.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		car := &pluginapi.ContainerAllocateResponse{}
		for _, id := range cr.DevicesIds {
			car.CdiDevices = append(car.CdiDevices, &pluginapi.CDIDevice{Name: CDIKind + "=" + id})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp, nil
}

// ErrNoAssignment says a container holds slots its pod's assignment does not
// cover: the pod was not placed by tessera-scheduler, or its assignment is
// for another node.
var ErrNoAssignment = errors.New("no Tessera GPU assignment covers this container")

// ErrNotTesseraScheduled says a pod carries an assignment but names a
// scheduler that does not run TesseraGPU: whoever wrote the assignment, no
// Tessera scheduler booked it, so the agent does not honour it.
var ErrNotTesseraScheduled = errors.New("the pod was not scheduled by a Tessera profile, so its assignment is not honoured")

// PreStartContainer finds the container holding the slots and writes their
// CDI spec from its pod's assignment.
func (p *Plugin) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	ns, name, container, err := p.holder.HolderOf(ctx, ResourceName, req.DevicesIds)
	if err != nil {
		return nil, fmt.Errorf("which container holds %s %v: %w", ResourceName, req.DevicesIds, err)
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(ns, name), "container", container)
	e, err := p.editsFor(klog.NewContext(ctx, logger), ns, name, container, len(req.DevicesIds))
	if p.reporter != nil {
		if pod := p.pods(ns, name); pod != nil {
			p.reporter.PreStarted(pod, container, len(req.DevicesIds), err)
		}
	}
	if err != nil {
		logger.Error(err, "Refusing GPU slots")
		return nil, err
	}
	if err := p.writeForHolder(ctx, req.DevicesIds, e, ns, name, container); err != nil {
		logger.Error(err, "Not writing the slots' CDI spec")
		return nil, err
	}
	logger.V(2).Info("GPU slots prepared", "slots", req.DevicesIds, "env", e.Env, "isolation", IsolationValue(e.Guarantees))
	return &pluginapi.PreStartContainerResponse{}, nil
}

// specWrites serializes, per spec file, the last look at a slot's holder
// and the write of the slot's spec, across every plugin of the process: a
// PreStartContainer still running when its container lost the slot (the
// pod deleted, kubelet or the agent restarted, the slot handed to another
// pod) must not overwrite the spec its next holder's call wrote (the soak,
// under load, saw a running container's slot show another pod's GPU).
var specWrites sync.Map // spec path → *sync.Mutex

// writeForHolder writes the slots' spec if ns/name/container still holds
// them, as kubelet says now, under the slots' locks.
func (p *Plugin) writeForHolder(ctx context.Context, slots []string, e Edits, ns, name, container string) error {
	paths := make([]string, len(slots))
	for i, slot := range slots {
		paths[i] = SpecPath(p.cdiDir, slot)
	}
	slices.Sort(paths) // one order for every caller: no deadlock
	for _, path := range slices.Compact(paths) {
		mu, _ := specWrites.LoadOrStore(path, &sync.Mutex{})
		mu.(*sync.Mutex).Lock()
		defer mu.(*sync.Mutex).Unlock()
	}
	nsNow, nameNow, containerNow, err := p.holder.HolderOf(ctx, ResourceName, slots)
	if err != nil {
		return fmt.Errorf("which container holds %s %v now: %w", ResourceName, slots, err)
	}
	if nsNow != ns || nameNow != name || containerNow != container {
		return fmt.Errorf("slots %v passed from pod %s/%s container %s to pod %s/%s container %s while their spec was prepared; the new holder's call writes it",
			slots, ns, name, container, nsNow, nameNow, containerNow)
	}
	if err := WriteSpec(p.cdiDir, slots, e); err != nil {
		return fmt.Errorf("write CDI spec for pod %s/%s container %s: %w", ns, name, container, err)
	}
	return nil
}

func (p *Plugin) editsFor(ctx context.Context, ns, name, container string, slots int) (Edits, error) {
	pod := p.pods(ns, name)
	if pod == nil {
		return Edits{}, fmt.Errorf("pod %s/%s: not known to the agent yet: %w", ns, name, ErrNoAssignment)
	}
	a, err := podgpu.BoundAssignment(pod)
	if err != nil {
		return Edits{}, err // it names the pod
	}
	if a == nil || a.Node != p.node {
		return Edits{}, fmt.Errorf("pod %s/%s (bound to %q) was not placed here by tessera-scheduler: %w", ns, name, pod.Spec.NodeName, ErrNoAssignment)
	}
	if !slices.Contains(p.schedulers, pod.Spec.SchedulerName) {
		return Edits{}, fmt.Errorf("pod %s/%s names spec.schedulerName %q, not one of %s: %w",
			ns, name, pod.Spec.SchedulerName, strings.Join(p.schedulers, ", "), ErrNotTesseraScheduled)
	}
	if p.inventory != nil && p.nodePods != nil {
		inv := p.inventory.Published()
		if inv == nil {
			return Edits{}, fmt.Errorf("pod %s/%s: the agent has not read this node's GPUs yet: %w", ns, name, ErrCannotHonour)
		}
		if err := Honoured(inv, p.nodePods(), p.schedulers, p.oversub, pod.UID); err != nil {
			return Edits{}, fmt.Errorf("pod %s/%s: %w", ns, name, err)
		}
	}
	for _, c := range a.Containers {
		if c.Name != container {
			continue
		}
		if len(c.GPUs) != slots {
			return Edits{}, fmt.Errorf("pod %s/%s container %s holds %d slots but is assigned %d GPUs", ns, name, container, slots, len(c.GPUs))
		}
		e, err := EditsFor(c, p.pipeDir)
		if err != nil {
			return e, err
		}
		if p.enforcer != nil {
			uuids := make([]string, len(c.GPUs))
			for i, g := range c.GPUs {
				uuids[i] = g.UUID
			}
			if e.Driver, err = p.enforcer.DriverEdits(uuids); err != nil {
				return Edits{}, fmt.Errorf("pod %s/%s container %s: the driver's files and device nodes for its GPUs: %w", ns, name, container, err)
			}
		}
		// Limits in force before the spec exists: the runtime cannot
		// create the container without it.
		if p.enforcer != nil {
			if e.Guarantees, err = p.enforcer.Isolate(ctx, pod, c); err != nil {
				return Edits{}, fmt.Errorf("pod %s/%s container %s: its GPU limits could not be set, so it does not start: %w", ns, name, container, err)
			}
			e.Env = append(e.Env, IsolationEnv+"="+IsolationValue(e.Guarantees))
		}
		if gpu.NeedsShim(e.Guarantees) {
			// The library holds these slices: without it in the
			// container nothing would, so the container does not start.
			if p.shim == nil {
				return Edits{}, fmt.Errorf("pod %s/%s container %s: its slices are held by libtessera, which this agent was not given (--shim-dir)", ns, name, container)
			}
			mounts, err := p.shim.Prepare(string(pod.UID), container, shim.Limits(c))
			if err != nil {
				return Edits{}, fmt.Errorf("pod %s/%s container %s: putting libtessera in the container, so it does not start: %w", ns, name, container, err)
			}
			for _, m := range mounts {
				opt := "rw"
				if m.ReadOnly {
					opt = "ro"
				}
				e.Mounts = append(e.Mounts, Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: []string{"rbind", opt}})
			}
		}
		if p.noticeDir == nil {
			return e, nil
		}
		// The preemption contract: the notice appears here, and the
		// workload reports its checkpoint here.
		dir := p.noticeDir(string(pod.UID))
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return Edits{}, fmt.Errorf("preemption notice directory: %w", err)
		}
		e.Mounts = append(e.Mounts, Mount{HostPath: dir, ContainerPath: preemption.ContainerDir, Options: []string{"rbind", "rw"}})
		return e, nil
	}
	return Edits{}, fmt.Errorf("pod %s/%s container %s: %w", ns, name, container, ErrNoAssignment)
}

// CollectSpecs removes the CDI specs of containers that no longer hold
// their slots (the pod finished or was deleted), so a slot handed to a new
// container never resolves to an old one's GPUs before PreStartContainer
// writes it afresh. It returns how many it removed.
//
// A spec written after kubelet's record was read belongs to a container
// being started whose slots the record may not show yet: it stays until the
// next pass. (The soak found the race: a spec removed between
// PreStartContainer and the container's creation leaves the container
// without its GPUs.)
func (p *Plugin) CollectSpecs(ctx context.Context) (int, error) {
	taken := time.Now()
	held, err := p.holder.Held(ctx, ResourceName)
	if err != nil {
		return 0, err
	}
	return collectSpecs(p.cdiDir, held, taken.Add(-specSettle))
}

// specSettle is how much older than kubelet's record a spec must be to be
// collected: file times are coarser than the clock.
const specSettle = time.Second
