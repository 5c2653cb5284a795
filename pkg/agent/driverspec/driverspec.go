// Package driverspec produces, with NVIDIA's own CDI generator (nvcdi, from
// the NVIDIA container toolkit), what a container needs of the driver to
// use its GPUs: the driver's libraries, binaries and IPC sockets, its
// control device nodes (/dev/nvidiactl, /dev/nvidia-uvm, …), its hooks, and
// each GPU's own device node. The device plugin writes these into every
// slot's CDI spec, for the container's assigned GPUs only, so that a
// container's GPUs are exactly its assignment: they do not rest on
// NVIDIA_VISIBLE_DEVICES and a runtime hook honouring it.
//
// The edits are generated once per driver (at the agent's start, and again
// when the driver version changes) and cached: nvcdi walks the driver root,
// which is too slow for every container start.
package driverspec

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/sirupsen/logrus"
	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/specs-go"
)

// Edits is the driver's part of every GPU container's CDI spec.
type Edits struct {
	// Driver is the driver version the edits were generated for.
	Driver string
	common specs.ContainerEdits
	byUUID map[string]specs.ContainerEdits
}

// Options say where the driver is.
type Options struct {
	// DriverRoot is where the driver's files are, as the agent sees them
	// ("/" on a host install; /run/nvidia/driver under the GPU operator's
	// driver container).
	DriverRoot string
	// DevRoot is where the device nodes are (DriverRoot when empty).
	DevRoot string
	// HookPath is the nvidia-cdi-hook binary on the host (nvcdi's default,
	// /usr/bin/nvidia-cdi-hook, when empty).
	HookPath string
}

// Generate runs NVIDIA's CDI generator on lib (the agent's NVML, already
// initialised) for every GPU.
func Generate(lib nvml.Interface, o Options) (*Edits, error) {
	if o.DevRoot == "" {
		o.DevRoot = o.DriverRoot
	}
	namer, err := nvcdi.NewDeviceNamer(nvcdi.DeviceNameStrategyUUID)
	if err != nil {
		return nil, err
	}
	opts := []nvcdi.Option{
		nvcdi.WithMode(nvcdi.ModeNvml), nvcdi.WithNvmlLib(lib), nvcdi.WithDriverRoot(o.DriverRoot), nvcdi.WithDevRoot(o.DevRoot),
		nvcdi.WithDeviceNamers(namer), nvcdi.WithLogger(quietLogger()),
		// nvsandboxutils is a second library the agent does not load.
		nvcdi.WithFeatureFlag(nvcdi.FeatureDisableNvsandboxUtils),
	}
	if o.HookPath != "" {
		opts = append(opts, nvcdi.WithNVIDIACDIHookPath(o.HookPath))
	}
	gen, err := nvcdi.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("NVIDIA CDI generator: %w", err)
	}
	common, err := gen.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("the driver's files under %s: %w", o.DriverRoot, err)
	}
	devs, err := gen.GetDeviceSpecsByID("all")
	if err != nil {
		return nil, fmt.Errorf("the GPUs' device nodes under %s: %w", o.DevRoot, err)
	}
	e := &Edits{byUUID: map[string]specs.ContainerEdits{}}
	if common != nil && common.ContainerEdits != nil {
		e.common = *common.ContainerEdits
	}
	// The variable is Tessera's to set (the assignment's UUIDs); nvcdi's
	// "void" would only hide them from the tenant.
	e.common.Env = slices.DeleteFunc(slices.Clone(e.common.Env), func(s string) bool { return strings.HasPrefix(s, "NVIDIA_VISIBLE_DEVICES=") })
	for _, d := range devs {
		e.byUUID[d.Name] = d.ContainerEdits
	}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		e.Driver = v
	}
	return e, nil
}

// For is the driver's edits for a container with these GPUs: the common
// part and each GPU's device node, nothing of the node's other GPUs.
func (e *Edits) For(uuids []string) (*specs.ContainerEdits, error) {
	out := specs.ContainerEdits{
		Env:    slices.Clone(e.common.Env),
		Hooks:  slices.Clone(e.common.Hooks),
		Mounts: slices.Clone(e.common.Mounts),
	}
	out.DeviceNodes = slices.Clone(e.common.DeviceNodes)
	out.AdditionalGIDs = slices.Clone(e.common.AdditionalGIDs)
	for _, u := range uuids {
		d, ok := e.byUUID[u]
		if !ok {
			return nil, fmt.Errorf("GPU %s is not one the driver's CDI generator found on this node", u)
		}
		out.DeviceNodes = append(out.DeviceNodes, d.DeviceNodes...)
		out.Mounts = append(out.Mounts, d.Mounts...)
		out.Hooks = append(out.Hooks, d.Hooks...)
		out.Env = append(out.Env, d.Env...)
		out.AdditionalGIDs = append(out.AdditionalGIDs, d.AdditionalGIDs...)
	}
	return &out, nil
}

// GPUs lists the UUIDs the edits cover.
func (e *Edits) GPUs() []string {
	out := make([]string, 0, len(e.byUUID))
	for u := range e.byUUID {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// quietLogger sends nvcdi's logrus messages to klog at V(4): its per-file
// "Selecting …" lines are for debugging the generator, not the agent.
func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.AddHook(klogHook{})
	l.SetLevel(logrus.DebugLevel)
	return l
}

type klogHook struct{}

func (klogHook) Levels() []logrus.Level { return logrus.AllLevels }
func (klogHook) Fire(e *logrus.Entry) error {
	if e.Level <= logrus.WarnLevel {
		klog.Background().Info("NVIDIA CDI generator: "+e.Message, "level", e.Level.String())
		return nil
	}
	klog.Background().V(4).Info("NVIDIA CDI generator: " + e.Message)
	return nil
}
