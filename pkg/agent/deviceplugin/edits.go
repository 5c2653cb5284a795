package deviceplugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// CDIKind is the CDI vendor/class of Tessera's slot devices: Allocate answers
// "tessera.dev/gpu=<slot>" and the container runtime resolves that name from
// the spec PreStartContainer writes for the slot.
const CDIKind = "tessera.dev/gpu"

// MPSPipeDirInContainer is where an MPS client finds its GPU's daemon.
const MPSPipeDirInContainer = "/tmp/nvidia-mps"

// Edits is what a container gets for its GPU assignment: the GPUs it may see
// and, for MPS clients, its daemon's pipe directory and its limits.
type Edits struct {
	Env    []string `json:"env"`
	Mounts []Mount  `json:"mounts,omitempty"`
	// Driver is the driver's part of the container (its GPUs' device
	// nodes, the control nodes, libraries and hooks), from NVIDIA's CDI
	// generator; nil where the agent runs without it.
	Driver *specs.ContainerEdits `json:"-"`
	// Guarantees says, per GPU of the container in assignment order, what
	// holds its slice (set by the plugin's Isolate).
	Guarantees []gpu.Guarantee `json:"-"`
}

// IsolationEnv is the variable that tells a tenant, from inside its
// container, what holds each of its GPUs' slices:
// "0:memory=kernel,compute=none;1:…" by ordinal.
const IsolationEnv = "TESSERA_GPU_ISOLATION"

// IsolationValue is IsolationEnv's value for the guarantees.
func IsolationValue(gs []gpu.Guarantee) string {
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = fmt.Sprintf("%d:%s", i, g)
	}
	return strings.Join(parts, ";")
}

// Mount is a CDI bind mount.
type Mount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options,omitempty"`
}

// PipeDir gives the host pipe directory of a GPU's MPS daemon.
type PipeDir func(uuid string) string

// EditsFor turns one container's assignment into its edits. The GPUs are
// listed in the order of the assignment, so ordinal i inside the container is
// the assignment's i-th GPU: MPS limits are keyed by that ordinal.
func EditsFor(c gpu.ContainerAssignment, pipeDir PipeDir) (Edits, error) {
	if len(c.GPUs) == 0 {
		return Edits{}, fmt.Errorf("container %s: assignment names no GPU", c.Name)
	}
	uuids := make([]string, len(c.GPUs))
	for i, g := range c.GPUs {
		uuids[i] = g.UUID
	}
	e := Edits{Env: []string{"NVIDIA_VISIBLE_DEVICES=" + strings.Join(uuids, ",")}}
	switch c.Mode {
	case gpu.ModeExclusive:
	case gpu.ModeMPS:
		// One MPS daemon per GPU: a multi-GPU MPS container would need two
		// pipe directories, which CUDA does not support.
		if len(c.GPUs) != 1 {
			return Edits{}, fmt.Errorf("container %s: MPS assignment over %d GPUs; an MPS client reaches one daemon", c.Name, len(c.GPUs))
		}
		g := c.GPUs[0]
		e.Env = append(e.Env,
			"CUDA_MPS_PIPE_DIRECTORY="+MPSPipeDirInContainer,
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(g.CoresPercent()),
			fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", g.MemoryMiB))
		e.Mounts = []Mount{{HostPath: pipeDir(g.UUID), ContainerPath: MPSPipeDirInContainer, Options: []string{"rbind", "rw"}}}
	case gpu.ModeTimeSlicing:
		// The grant, for the tenant and an in-container limiter; what holds
		// it is the kernel's memory limit where the driver offers one
		// (IsolationEnv says), and nothing for compute.
		var mem, cores []string
		for i, g := range c.GPUs {
			mem = append(mem, fmt.Sprintf("%d=%d", i, g.MemoryMiB))
			cores = append(cores, fmt.Sprintf("%d=%d", i, g.CoresPercent()))
		}
		e.Env = append(e.Env, "TESSERA_GPU_MEMORY_LIMIT_MIB="+strings.Join(mem, ","), "TESSERA_GPU_CORES_PERCENT="+strings.Join(cores, ","))
	default:
		return Edits{}, fmt.Errorf("container %s: unknown sharing mode %q", c.Name, c.Mode)
	}
	sort.Strings(e.Env[1:])
	return e, nil
}

// cdiSpec is the subset of the CDI specification collectSpecs reads back.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name string `json:"name"`
}

// containerEdits is e as CDI container edits; with the driver's edits when
// withDriver.
func (e Edits) containerEdits(withDriver bool) specs.ContainerEdits {
	out := specs.ContainerEdits{Env: slices.Clone(e.Env)}
	for _, m := range e.Mounts {
		out.Mounts = append(out.Mounts, &specs.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: m.Options})
	}
	if withDriver && e.Driver != nil {
		d := e.Driver
		out.Env = append(out.Env, d.Env...)
		out.DeviceNodes = append(out.DeviceNodes, d.DeviceNodes...)
		out.Mounts = append(out.Mounts, d.Mounts...)
		out.Hooks = append(out.Hooks, d.Hooks...)
		out.AdditionalGIDs = append(out.AdditionalGIDs, d.AdditionalGIDs...)
		out.IntelRdt, out.NetDevices = d.IntelRdt, d.NetDevices
	}
	return out
}

// oldestCDIVersion is the version written when nothing in a spec needs a
// newer one: what every release of this agent has written.
const oldestCDIVersion = "0.6.0"

// WriteSpec writes the CDI specs of the slots a container holds, each
// carrying the container's edits, in dir: one file per slot, replaced
// atomically (write then rename). A slot is thus defined in exactly one file
// at every moment, whichever container held it before: the runtime refuses
// a device defined twice, as a spec per container left behind by a deleted
// pod did until it was collected.
//
// The driver's edits go into the first slot's spec only: the runtime
// applies every slot of the container, and the driver's hooks need run once.
func WriteSpec(dir string, slots []string, e Edits) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, slot := range slots {
		if err := writeDeviceSpec(SpecPath(dir, slot), CDIKind, slot, e.containerEdits(i == 0)); err != nil {
			return err
		}
	}
	return nil
}

// WriteDeviceSpec writes, at path, the CDI spec of one device kind=name
// carrying all of e (the driver's edits too), replaced atomically: the DRA
// driver's spec of a claim.
func WriteDeviceSpec(path, kind, name string, e Edits) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeDeviceSpec(path, kind, name, e.containerEdits(true))
}

func writeDeviceSpec(path, kind, name string, edits specs.ContainerEdits) error {
	spec := &specs.Spec{Kind: kind, Devices: []specs.Device{{Name: name, ContainerEdits: edits}}}
	v, err := specs.MinimumRequiredVersion(spec)
	if err != nil {
		return fmt.Errorf("CDI version for %s=%s: %w", kind, name, err)
	}
	spec.Version = newestVersion(v, oldestCDIVersion)
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// newestVersion is the later of two "major.minor.patch" versions.
func newestVersion(a, b string) string {
	parse := func(v string) (out [3]int) {
		for i, f := range strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3) {
			out[i], _ = strconv.Atoi(f)
		}
		return out
	}
	pa, pb := parse(a), parse(b)
	for i := range pa {
		if pa[i] != pb[i] {
			if pa[i] > pb[i] {
				return a
			}
			return b
		}
	}
	return a
}

// SpecPath is where a slot's spec lives.
func SpecPath(dir, slot string) string {
	return filepath.Join(dir, "tessera-"+slot+".json")
}

// collectSpecs removes, in dir, the slot specs whose slot is not held, and
// any of ours not in the one-slot-per-file form (an older agent's, which
// could define a slot a second time).
func collectSpecs(dir string, held map[string]bool, writtenBefore time.Time) (int, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "tessera-*.json"))
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var spec cdiSpec
		if json.Unmarshal(b, &spec) != nil || spec.Kind != CDIKind {
			continue // not ours
		}
		current := len(spec.Devices) == 1 && SpecPath(dir, spec.Devices[0].Name) == path
		if current && held[spec.Devices[0].Name] {
			continue
		}
		if info, err := os.Stat(path); err != nil || !info.ModTime().Before(writtenBefore) {
			continue // newer than kubelet's record: a container being started
		}
		if err := os.Remove(path); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}
