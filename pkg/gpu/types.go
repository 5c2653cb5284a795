package gpu

// ResourceGPU and its siblings are the extended resources a pod asks for, per
// container. They are the user-facing contract (see docs/user-guide.md).
const (
	// ResourceGPU is the number of GPUs a container wants.
	ResourceGPU = "tessera.dev/gpu"
	// ResourceMemory is the GPU memory, in MiB, wanted on each of those GPUs.
	ResourceMemory = "tessera.dev/gpu-memory"
	// ResourceCores is the percentage (1–100) of one GPU's SMs wanted on each GPU.
	ResourceCores = "tessera.dev/gpu-cores"
)

// Pod annotations a user may set.
const (
	AnnotationSharing  = "tessera.dev/sharing"
	AnnotationWorkload = "tessera.dev/workload"
	AnnotationGPUModel = "tessera.dev/gpu-model"
)

// AnnotationAssignment is written by the scheduler only; the agent trusts nothing
// else. It holds an encoded PodAssignment (see EncodeAssignment).
const AnnotationAssignment = "tessera.dev/assignment"

// AnnotationInventory is the node annotation in which the agent publishes the
// node's NodeInventory (see EncodeInventory) for the scheduler to read.
const AnnotationInventory = "tessera.dev/inventory"

// CoresPerGPU is the compute capacity of one GPU in Tessera's internal unit:
// per-mille of its SMs. Users speak percent (1–100); the trace simulator speaks
// milli-GPU (1–1000); per-mille serves both without rounding.
const CoresPerGPU = 1000

// SharingMode is how a GPU is shared, or how a pod wants to share one.
type SharingMode string

// Sharing modes. A pod asks for one of them (or auto); a GPU runs exactly one
// at a time (ModeNone while it is free).
const (
	ModeNone        SharingMode = ""
	ModeAuto        SharingMode = "auto"
	ModeExclusive   SharingMode = "exclusive"
	ModeMPS         SharingMode = "mps"
	ModeTimeSlicing SharingMode = "time-slicing"
)

// WorkloadClass says what a pod does with its GPU; it selects the minimum slice.
type WorkloadClass string

// Workload classes.
const (
	WorkloadUnspecified WorkloadClass = ""
	WorkloadTraining    WorkloadClass = "training"
	WorkloadInference   WorkloadClass = "inference"
)

// Device is one physical GPU of a node as the agent reports it.
type Device struct {
	// Index is the NVML index on the node.
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// Model is the product name, for example "NVIDIA H100 80GB HBM3" or a short
	// name such as "A100"; allow-lists match it exactly.
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	SMCount   int    `json:"smCount,omitempty"`
	Healthy   bool   `json:"healthy"`
	// MPSCapable says the agent runs an MPS daemon for this GPU, so sharing
	// requests landing on it run as MPS clients with driver-enforced limits.
	MPSCapable bool `json:"mpsCapable,omitempty"`
	// NVLinkPeers lists the indices of GPUs reachable over NVLink.
	NVLinkPeers []int `json:"nvlinkPeers,omitempty"`
	// Slices is the most containers the agent lets share this GPU, as the
	// slice adjuster sets it from the forecast load; 0 sets no limit.
	Slices int `json:"slices,omitempty"`
	// Isolation is what the GPU's driver offers to hold slices; nil from an
	// agent that does not say (one older than this field), read as nothing
	// offered.
	Isolation *IsolationOffer `json:"isolation,omitempty"`
}

// Offer is the device's isolation offer, the zero offer when it has none.
func (d *Device) Offer() IsolationOffer {
	if d.Isolation == nil {
		return IsolationOffer{}
	}
	return *d.Isolation
}

// NodeInventory is what a node offers: its allocatable CPU and memory and its GPUs.
type NodeInventory struct {
	Node      string   `json:"node"`
	CPUMilli  int64    `json:"cpuMilli"`
	MemoryMiB int64    `json:"memoryMiB"`
	GPUs      []Device `json:"gpus"`
	// DRA says the node serves its GPUs through the DRA driver (DRADriver):
	// pods ask there with ResourceClaims, and tessera-scheduler places no
	// tessera.dev/gpu pod on it (kubelet has no slots to give).
	DRA bool `json:"dra,omitempty"`
	// Reclaimed lists the UIDs of preempted pods whose GPUs the agent has
	// verified clean (no process of theirs holds a CUDA context), most
	// recent last, bounded by MaxReclaimed. The scheduler keeps a
	// preemption victim's slices booked until its UID appears here.
	Reclaimed []string `json:"reclaimed,omitempty"`
	// NoGPU says why an agent serves no GPU at all, when it runs as an
	// empty node (--allow-no-gpu) because NVML could not load: what the
	// doctor tells the operator. Empty on a node with a driver.
	NoGPU string `json:"noGPU,omitempty"`
}

// MaxReclaimed bounds NodeInventory.Reclaimed: the scheduler reads the list
// within seconds of a change, so a short memory suffices.
const MaxReclaimed = 64

// GPUGrant is what one container got on one GPU.
type GPUGrant struct {
	UUID      string `json:"uuid"`
	Index     int    `json:"index"`
	MemoryMiB int64  `json:"memoryMiB"`
	// CoresPerMille is the share of the GPU's SMs, in per-mille (see CoresPerGPU).
	CoresPerMille int `json:"cores"`
}

// CoresPercent is the grant's share of the SMs in the percent users speak,
// rounded up: a limit enforced in percent must never be below the grant.
func (g GPUGrant) CoresPercent() int {
	return (g.CoresPerMille*100 + CoresPerGPU - 1) / CoresPerGPU
}

// ContainerAssignment is the scheduler's decision for one container.
type ContainerAssignment struct {
	Name string      `json:"name"`
	Mode SharingMode `json:"mode"`
	GPUs []GPUGrant  `json:"gpus"`
}

// PodAssignment is the scheduler's decision for a pod on one node.
type PodAssignment struct {
	Node       string                `json:"node"`
	Containers []ContainerAssignment `json:"containers"`
}
