package deviceplugin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

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
	// Enforced says whether a driver mechanism enforces the slice's limits
	// (MPS client limits); time-sliced slices are accounted, not enforced.
	Enforced bool `json:"-"`
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
		e.Enforced = true
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
		e.Enforced = true
	case gpu.ModeTimeSlicing:
		// Recorded for an in-container limiter; no driver mechanism enforces
		// them on a time-sliced GPU.
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

// cdiSpec is the subset of the CDI specification the slots use.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string `json:"name"`
	ContainerEdits Edits  `json:"containerEdits"`
}

// WriteSpec writes the CDI specs of the slots a container holds, each
// carrying the container's edits, in dir: one file per slot, replaced
// atomically (write then rename). A slot is thus defined in exactly one file
// at every moment, whichever container held it before: the runtime refuses
// a device defined twice, as a spec per container left behind by a deleted
// pod did until it was collected.
func WriteSpec(dir string, slots []string, e Edits) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, slot := range slots {
		b, err := json.MarshalIndent(cdiSpec{Version: "0.6.0", Kind: CDIKind, Devices: []cdiDevice{{Name: slot, ContainerEdits: e}}}, "", "  ")
		if err != nil {
			return err
		}
		path := SpecPath(dir, slot)
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
	}
	return nil
}

// SpecPath is where a slot's spec lives.
func SpecPath(dir, slot string) string {
	return filepath.Join(dir, "tessera-"+slot+".json")
}

// collectSpecs removes, in dir, the slot specs whose slot is not held, and
// any of ours not in the one-slot-per-file form (an older agent's, which
// could define a slot a second time).
func collectSpecs(dir string, held map[string]bool) (int, error) {
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
		if err := os.Remove(path); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}
