package doctor

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/pkg/nvml"
)

// Versions that bring what Tessera uses, checked against the version that
// introduced each feature (the source write-up's 470 / 11.4 are not enough
// for MPS client memory limits).
const (
	// cudaMPSMemoryLimit: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA 11.5 (driver
	// R495).
	cudaMPSMemoryLimit = 11050
	// minKernelMajor/Minor: cgroup v2 as kubelet and NVML's cgroup limits
	// use it; 5.8 is where Kubernetes' cgroup v2 support starts.
	minKernelMajor, minKernelMinor = 5, 8
)

// NodeOptions say what a node is expected to run.
type NodeOptions struct {
	// MPS: the node's agent runs MPS (tessera-agent --mps).
	MPS bool
	// InAgent: the checks run inside tessera-agent's container, which
	// sees the host's /proc, /sys, kubelet's directories and the driver
	// but not the container runtime's or kubelet's configuration files:
	// those checks are left to `tessera doctor node` on the node.
	InAgent bool
}

// NodeChecks are the node checks over facts already gathered.
func NodeChecks(f NodeFacts, o NodeOptions) []Check {
	pure := func(id string, fn func(NodeFacts, NodeOptions) []Finding) Check {
		return Check{ID: id, Run: func(context.Context) []Finding { return fn(f, o) }}
	}
	return []Check{
		pure("kernel", checkKernel),
		pure("driver", checkDriver),
		pure("gpu", checkGPUs),
		pure("isolation", checkIsolation),
		pure("mps", checkMPS),
		pure("kubelet", checkKubelet),
		pure("runtime", func(f NodeFacts, o NodeOptions) []Finding {
			if o.InAgent {
				return []Finding{{ID: "runtime.cdi", Severity: Info, Summary: "the container runtime's configuration is not visible from tessera-agent's container, so it was not checked",
					Remedy: "Run `tessera doctor node` on the node itself for the runtime's CDI and the NVIDIA toolkit's settings."}}
			}
			return checkRuntime(f, o)
		}),
		pure("leftovers", checkLeftovers),
	}
}

// DiagnoseNode gathers a node's facts and runs every node check.
func DiagnoseNode(ctx context.Context, root fs.FS, lib gonvml.Interface, libErr error, query MPSQuery, o NodeOptions, timeout time.Duration) []Finding {
	gather := make(chan NodeFacts, 1)
	go func() { gather <- GatherNode(root, lib, libErr, query) }()
	select {
	case f := <-gather:
		return Run(ctx, NodeChecks(f, o), timeout)
	case <-time.After(timeout):
		return []Finding{{ID: "node", Severity: Error, Summary: fmt.Sprintf("reading the node took longer than %v; nothing was checked", timeout),
			Remedy: "NVML or a file system is stuck: check `nvidia-smi` answers and dmesg for GPU errors (Xid)."}}
	}
}

func pass(id, subject, summary, evidence string) Finding {
	return Finding{ID: id, Severity: OK, Subject: subject, Summary: summary, Evidence: evidence}
}

func checkKernel(f NodeFacts, _ NodeOptions) []Finding {
	var out []Finding
	switch major, minor, err := kernelVersion(f.KernelRelease); {
	case f.KernelErr != nil:
		out = append(out, Finding{ID: "kernel.version", Severity: Warning, Summary: "the kernel's release could not be read", Evidence: f.KernelErr.Error(),
			Remedy: "Run the doctor on the node itself with the host's /proc (hostPID, or /proc mounted)."})
	case err != nil:
		out = append(out, Finding{ID: "kernel.version", Severity: Warning, Summary: "the kernel's release is not a version the doctor reads", Evidence: f.KernelRelease})
	case major < minKernelMajor || major == minKernelMajor && minor < minKernelMinor:
		out = append(out, Finding{ID: "kernel.version", Severity: Error, Summary: fmt.Sprintf("kernel %d.%d is older than %d.%d", major, minor, minKernelMajor, minKernelMinor),
			Evidence: f.KernelRelease, Remedy: "Upgrade the kernel (an LTS of 5.15 or later) so kubelet and the driver's cgroup limits get cgroup v2."})
	default:
		out = append(out, pass("kernel.version", "", "kernel "+f.KernelRelease, f.KernelRelease))
	}
	if f.CgroupErr != nil {
		out = append(out, Finding{ID: "kernel.cgroup-v2", Severity: Error, Summary: "no cgroup v2 hierarchy at /sys/fs/cgroup",
			Evidence: f.CgroupErr.Error(),
			Remedy:   "Boot with the unified hierarchy (systemd.unified_cgroup_hierarchy=1, the default of current distributions) and set kubelet's cgroupDriver to match the runtime's."})
		return out
	}
	out = append(out, pass("kernel.cgroup-v2", "", "cgroup v2 at /sys/fs/cgroup", strings.Join(f.CgroupControllers, " ")))
	if slices.Contains(f.CgroupControllers, "dmem") {
		out = append(out, pass("kernel.dmem", "", "the kernel has the dmem cgroup controller", strings.Join(f.CgroupControllers, " ")))
	} else {
		out = append(out, Finding{ID: "kernel.dmem", Severity: Info, Summary: "the kernel has no dmem cgroup controller",
			Evidence: "controllers: " + strings.Join(f.CgroupControllers, " "),
			Remedy:   "Kernel GPU memory limits are offered where the driver's NVML answers for cgroups (see isolation.kernel-memory); a kernel with dmem (Linux 6.14 and later) is the other half where the driver uses it."})
	}
	return out
}

// kernelVersion reads "6.8.0-45-generic" as 6, 8.
func kernelVersion(release string) (major, minor int, err error) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, fmt.Errorf("no major.minor in %q", release)
	}
	if major, err = strconv.Atoi(parts[0]); err != nil {
		return 0, 0, err
	}
	digits := strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	minor, err = strconv.Atoi(digits)
	return major, minor, err
}

func checkDriver(f NodeFacts, _ NodeOptions) []Finding {
	if f.NVMLErr != nil {
		return []Finding{{ID: "driver.nvml", Severity: Error, Summary: "the NVIDIA driver's NVML could not be read", Evidence: f.NVMLErr.Error(),
			Remedy: "Install the NVIDIA driver (and load its kernel module: `nvidia-smi` must answer); in a container, run with the NVIDIA runtime and NVIDIA_DRIVER_CAPABILITIES=utility."}}
	}
	out := []Finding{pass("driver.version", "", fmt.Sprintf("driver %s, CUDA %s", f.Driver, cudaString(f.CUDA)), f.Driver)}
	if f.CUDA > 0 && f.CUDA < cudaMPSMemoryLimit {
		out = append(out, Finding{ID: "driver.mps-memory-limit", Severity: Warning,
			Summary:  fmt.Sprintf("CUDA %s predates MPS client memory limits (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA 11.5)", cudaString(f.CUDA)),
			Evidence: "driver " + f.Driver, Remedy: "Upgrade the driver to R495 or later; until then an MPS slice's memory is held by nothing."})
	}
	return out
}

func cudaString(v int) string {
	if v <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

func checkGPUs(f NodeFacts, o NodeOptions) []Finding {
	if f.NVMLErr != nil {
		return nil // driver.nvml says why
	}
	if len(f.GPUs) == 0 {
		return []Finding{{ID: "gpu.count", Severity: Error, Summary: "NVML answers but lists no GPU", Evidence: "driver " + f.Driver,
			Remedy: "Check `nvidia-smi -L` and dmesg for GPUs that fell off the bus (Xid 79)."}}
	}
	var out []Finding
	for _, g := range f.GPUs {
		subject := fmt.Sprintf("GPU %d %s", g.Index, g.UUID)
		switch {
		case g.Persistence == nil:
			out = append(out, Finding{ID: "gpu.persistence", Severity: Info, Subject: subject, Summary: "persistence mode could not be read"})
		case !*g.Persistence:
			out = append(out, Finding{ID: "gpu.persistence", Severity: Warning, Subject: subject, Summary: "persistence mode is off",
				Evidence: "nvmlDeviceGetPersistenceMode: disabled",
				Remedy:   "Run nvidia-persistenced (systemctl enable --now nvidia-persistenced): without it the driver unloads between jobs and forgets the GPU's compute mode and MPS settings."})
		default:
			out = append(out, pass("gpu.persistence", subject, "persistence mode on", ""))
		}
		if g.MIG {
			out = append(out, Finding{ID: "gpu.mig", Severity: Info, Subject: subject, Summary: "MIG is enabled: Tessera does not slice this GPU and publishes it unhealthy",
				Remedy: "Disable MIG (nvidia-smi -i N -mig 0, then reset the GPU) to share it with Tessera."})
		}
		mode := nvml.ComputeModeName(g.ComputeMode)
		switch {
		case o.MPS && g.ComputeMode != gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
			out = append(out, Finding{ID: "gpu.compute-mode", Severity: Warning, Subject: subject, Summary: "compute mode is " + mode + " on an MPS node",
				Evidence: mode, Remedy: "tessera-agent sets exclusive-process when it starts MPS; if it stays " + mode + ", the agent is not running or lacks the right to set it (it runs privileged)."})
		case !o.MPS && g.ComputeMode != gonvml.COMPUTEMODE_DEFAULT:
			out = append(out, Finding{ID: "gpu.compute-mode", Severity: Warning, Subject: subject, Summary: "compute mode is " + mode + " on a time-sliced node",
				Evidence: mode, Remedy: "Time-sliced tenants need the default compute mode: nvidia-smi -i N -c DEFAULT (an MPS agent left it exclusive)."})
		default:
			out = append(out, pass("gpu.compute-mode", subject, "compute mode "+mode, mode))
		}
	}
	return out
}

// checkIsolation says which of the mechanisms Tessera uses this node
// offers.
func checkIsolation(f NodeFacts, o NodeOptions) []Finding {
	var out []Finding
	if f.NVMLErr == nil {
		for _, g := range f.GPUs {
			subject := fmt.Sprintf("GPU %d %s", g.Index, g.UUID)
			switch {
			case g.KernelLimitsErr != nil:
				out = append(out, Finding{ID: "isolation.kernel-memory", Severity: Warning, Subject: subject,
					Summary: "whether the driver offers per-cgroup memory limits could not be read", Evidence: g.KernelLimitsErr.Error()})
			case !g.KernelLimits:
				out = append(out, Finding{ID: "isolation.kernel-memory", Severity: Info, Subject: subject,
					Summary: "the driver offers no per-cgroup memory limits: time-sliced slices' memory is held by libtessera inside the container (shim), not by the kernel", Evidence: "driver " + f.Driver + ": NVML memory limits not supported",
					Remedy: "Nothing to do for tenants that use CUDA: the agent's --shim-dir (chart agent.shim) preloads the shim into their containers. Against one that bypasses CUDA's driver API only the kernel holds: upgrade to a driver whose NVML has nvmlDeviceSetMemoryLimits (whether it answers is what counts), and pods that need it ask tessera.dev/isolation: memory-hard."})
			default:
				out = append(out, pass("isolation.kernel-memory", subject, "NVML per-cgroup memory limits offered", "driver "+f.Driver))
			}
		}
	}
	if f.NvidiaSMI == "" {
		out = append(out, Finding{ID: "isolation.time-slice", Severity: Warning, Summary: "nvidia-smi not found: time-shared GPUs keep the driver's default time slice",
			Remedy: "Install the driver's utilities (nvidia-utils) or give tessera-agent --nvidia-smi."})
	} else {
		out = append(out, pass("isolation.time-slice", "", "time-slice classes can be set", f.NvidiaSMI))
	}
	return out
}

func checkMPS(f NodeFacts, o NodeOptions) []Finding {
	if !o.MPS {
		return nil
	}
	if f.MPSControl == "" {
		return []Finding{{ID: "mps.control", Severity: Error, Summary: "nvidia-cuda-mps-control not found on an MPS node",
			Remedy: "Install the driver's MPS control program (it ships with the driver's utilities) or give tessera-agent --mps-control; until then no MPS daemon starts."}}
	}
	out := []Finding{pass("mps.control", "", "MPS control program found", f.MPSControl)}
	running := map[string]bool{}
	for _, d := range f.MPSDaemons {
		running[d.UUID] = d.Pipe
		switch {
		case d.Pipe && d.QueryErr != nil:
			out = append(out, Finding{ID: "mps.daemon", Severity: Error, Subject: d.UUID, Summary: "the MPS daemon's pipe is there but it does not answer: MPS clients on this GPU cannot start",
				Evidence: d.QueryErr.Error() + "\n" + strings.Join(d.LogTail, "\n"),
				Remedy:   "tessera-agent restarts a daemon that stops answering within 5 s; if this stays, read its log above and the agent's (a driver and MPS control program of different versions keep it down)."})
			continue
		case d.Pipe && d.Queried:
			var servers []string
			for _, s := range d.Servers {
				servers = append(servers, fmt.Sprintf("server %s: %d client(s) %s", s.PID, len(s.Clients), strings.Join(s.Clients, " ")))
			}
			if len(servers) == 0 {
				servers = []string{"no server yet (none starts before the first client)"}
			}
			out = append(out, pass("mps.daemon", d.UUID, "MPS daemon answers", strings.Join(servers, "; ")))
			continue
		case d.Pipe:
			out = append(out, pass("mps.daemon", d.UUID, "MPS daemon up (its pipe exists; not asked)", ""))
			continue
		}
		out = append(out, Finding{ID: "mps.daemon", Severity: Error, Subject: d.UUID, Summary: "the MPS daemon is not running (no control pipe)",
			Evidence: strings.Join(d.LogTail, "\n"),
			Remedy:   "Read its log above: a compute mode other than exclusive-process, a GPU in use by a non-MPS process, or a driver and MPS control of different versions keep it down; the agent restarts it every 5 s."})
	}
	for _, g := range f.GPUs {
		if _, seen := running[g.UUID]; !seen && !g.MIG {
			out = append(out, Finding{ID: "mps.daemon", Severity: Error, Subject: g.UUID, Summary: "no MPS daemon directory for this GPU on an MPS node",
				Remedy: "tessera-agent starts one per GPU under /run/tessera/mps: check the agent runs on this node (kubectl -n tessera-system get pods -o wide) and its log."})
		}
	}
	return out
}

// removedKubeletGates are feature gates kubelet no longer knows: it
// refuses to start with them.
var removedKubeletGates = map[string]string{
	"DynamicKubeletConfig": "removed in Kubernetes 1.26",
	"DevicePlugins":        "GA in Kubernetes 1.26 and removed as a gate in 1.28",
}

func checkKubelet(f NodeFacts, _ NodeOptions) []Finding {
	k := f.Kubelet
	var out []Finding
	switch {
	case !k.DevicePluginDir:
		out = append(out, Finding{ID: "kubelet.device-plugins", Severity: Error, Summary: "no /var/lib/kubelet/device-plugins directory",
			Remedy: "Kubelet creates it at start: is kubelet running on this node, with --root-dir /var/lib/kubelet?"})
	case !k.KubeletSocket:
		out = append(out, Finding{ID: "kubelet.device-plugins", Severity: Error, Summary: "kubelet's device-plugin registration socket is missing",
			Remedy: "Restart kubelet; device plugins (tessera-agent) cannot register until kubelet.sock exists."})
	case len(k.TesseraSockets) == 0:
		out = append(out, Finding{ID: "kubelet.registration", Severity: Error, Summary: "tessera-agent has not registered with kubelet (no tessera-*.sock): GPU pods stay in ContainerCreating or Pending",
			Remedy: "Check the agent's pod on this node (kubectl -n tessera-system logs ds/tessera-agent) and kubelet's log for \"Got registration request from device plugin\"."})
	default:
		out = append(out, pass("kubelet.registration", "", "tessera-agent registered with kubelet", strings.Join(k.TesseraSockets, " ")))
	}
	if !k.PodResources {
		out = append(out, Finding{ID: "kubelet.pod-resources", Severity: Error, Summary: "kubelet's pod-resources socket is missing",
			Remedy: "tessera-agent maps slots to containers through /var/lib/kubelet/pod-resources/kubelet.sock; restart kubelet, and mount the directory into the agent."})
	} else {
		out = append(out, pass("kubelet.pod-resources", "", "pod-resources socket present", "/"+pathPodResources))
	}
	if k.ConfigErr != nil {
		out = append(out, Finding{ID: "kubelet.config", Severity: Warning, Summary: "kubelet's config file is not valid YAML", Evidence: k.ConfigErr.Error()})
	}
	if gates, ok := k.Config["featureGates"].(map[string]any); ok {
		for _, g := range slices.Sorted(maps.Keys(gates)) {
			if why, removed := removedKubeletGates[g]; removed {
				out = append(out, Finding{ID: "kubelet.feature-gate", Severity: Error, Subject: g,
					Summary:  fmt.Sprintf("kubelet's config sets feature gate %s, %s: kubelet refuses to start", g, why),
					Evidence: fmt.Sprintf("featureGates: {%s: %v} in /%s", g, gates[g], pathKubeletConfig), Remedy: "Remove it from featureGates (the source write-up's advice is outdated)."})
			}
		}
	}
	for _, key := range []string{"cpuManagerPolicy", "topologyManagerPolicy"} {
		if v, ok := k.Config[key].(string); ok && v != "" && v != "none" {
			out = append(out, Finding{ID: "kubelet." + key, Severity: Info, Summary: fmt.Sprintf("%s is %s", key, v), Evidence: v,
				Remedy: "Tessera's slots carry no NUMA hints: with topologyManagerPolicy single-numa-node or restricted, kubelet aligns CPUs alone; GPU affinity comes from the scheduler's NVLink preference."})
		}
	}
	for _, a := range k.Args {
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case name == "container-runtime" && strings.HasPrefix(a, "--"):
			out = append(out, Finding{ID: "kubelet.flag", Severity: Error, Subject: "--container-runtime",
				Summary:  "kubelet is started with --container-runtime, removed in Kubernetes 1.27",
				Evidence: a, Remedy: "Remove the flag from kubelet's arguments (/etc/default/kubelet or its systemd drop-in); keep --container-runtime-endpoint."})
		case name == "feature-gates":
			for _, g := range strings.Split(value, ",") {
				gate, _, _ := strings.Cut(g, "=")
				if why, removed := removedKubeletGates[gate]; removed {
					out = append(out, Finding{ID: "kubelet.feature-gate", Severity: Error, Subject: gate,
						Summary: fmt.Sprintf("kubelet is started with feature gate %s, %s", gate, why), Evidence: a, Remedy: "Remove it from --feature-gates."})
				}
			}
		}
	}
	return out
}

func checkRuntime(f NodeFacts, _ NodeOptions) []Finding {
	var out []Finding
	switch c := f.Containerd; {
	case c == nil && !f.CRIO:
		out = append(out, Finding{ID: "runtime.cdi", Severity: Warning, Summary: "neither containerd's nor CRI-O's config was found, so CDI could not be checked",
			Remedy: "Tessera's slots are CDI devices: enable CDI in the runtime (containerd enable_cdi, on by default from 2.0; CRI-O has it on)."})
	case c == nil:
		out = append(out, pass("runtime.cdi", "", "CRI-O: CDI is on by default", "/"+pathCRIO))
	case c.Err != nil:
		out = append(out, Finding{ID: "runtime.cdi", Severity: Warning, Summary: "containerd's config could not be parsed", Evidence: c.Path + ": " + c.Err.Error()})
	default:
		on := c.Version >= 3 // containerd 2.x enables CDI by default
		if c.EnableCDI != nil {
			on = *c.EnableCDI
		}
		dirs := c.CDISpecDirs
		if len(dirs) == 0 {
			dirs = []string{"/etc/cdi", "/var/run/cdi"}
		}
		read := c.Path
		if len(c.Imports) > 0 {
			read += " (with " + strings.Join(c.Imports, ", ") + ")"
		}
		switch {
		case !on:
			out = append(out, Finding{ID: "runtime.cdi", Severity: Error, Summary: "containerd's CDI is off: GPU containers fail to start (unresolvable CDI device tessera.dev/gpu=…)",
				Evidence: fmt.Sprintf("%s: config version %d, enable_cdi %v", read, c.Version, boolString(c.EnableCDI)),
				Remedy:   `Set enable_cdi = true and cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"] in the CRI plugin's section of ` + c.Path + ` and restart containerd.`})
		case !slices.Contains(dirs, "/var/run/cdi"):
			out = append(out, Finding{ID: "runtime.cdi", Severity: Error, Summary: "containerd does not read /var/run/cdi, where tessera-agent writes the slots' specs",
				Evidence: read + ": cdi_spec_dirs = " + strings.Join(dirs, ", "), Remedy: `Add "/var/run/cdi" to cdi_spec_dirs in ` + c.Path + ` and restart containerd.`})
		default:
			out = append(out, pass("runtime.cdi", "", "containerd's CDI is on and reads /var/run/cdi", read+": "+strings.Join(dirs, ", ")))
		}
	}
	if f.NvidiaRuntime == "" && f.CDIHook == "" {
		out = append(out, Finding{ID: "runtime.nvidia-toolkit", Severity: Error, Summary: "the NVIDIA container toolkit is not installed",
			Remedy: "Install nvidia-container-toolkit: tessera-agent gets the driver from it, and the slot specs' hooks are its nvidia-cdi-hook."})
		return out
	}
	out = append(out, pass("runtime.nvidia-toolkit", "", "NVIDIA container toolkit found", f.NvidiaRuntime+" "+f.CDIHook))
	if f.RuntimeConfigErr != nil {
		out = append(out, Finding{ID: "runtime.nvidia-config", Severity: Warning, Summary: "the NVIDIA runtime's config could not be parsed", Evidence: f.RuntimeConfigErr.Error()})
	} else if f.RuntimeConfig != nil {
		accept, set := f.RuntimeConfig["accept-nvidia-visible-devices-envvar-when-unprivileged"].(bool)
		if !set || accept {
			out = append(out, Finding{ID: "runtime.visible-devices", Severity: Warning,
				Summary:  "the NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES from unprivileged containers: a container's GPUs rest on a variable",
				Evidence: fmt.Sprintf("accept-nvidia-visible-devices-envvar-when-unprivileged = %v (unset is true)", accept || !set),
				Remedy:   "Set accept-nvidia-visible-devices-envvar-when-unprivileged = false in /etc/nvidia-container-runtime/config.toml; the slot specs name each container's device nodes."})
		} else {
			out = append(out, pass("runtime.visible-devices", "", "NVIDIA_VISIBLE_DEVICES from unprivileged containers is ignored", "accept-nvidia-visible-devices-envvar-when-unprivileged = false"))
		}
	}
	return out
}

func boolString(b *bool) string {
	if b == nil {
		return "unset"
	}
	return strconv.FormatBool(*b)
}

// checkLeftovers reports what no running container owns: GPU processes
// outside Kubernetes, and slot specs while no Tessera plugin is registered
// (an agent that is gone).
func checkLeftovers(f NodeFacts, _ NodeOptions) []Finding {
	var out []Finding
	for _, g := range f.GPUs {
		for _, p := range g.Processes {
			if p.PodUID != "" {
				continue
			}
			evidence := fmt.Sprintf("pid %d (%s)", p.PID, p.Comm)
			if p.Err != nil {
				evidence += ": " + p.Err.Error()
			}
			out = append(out, Finding{ID: "leftovers.gpu-processes", Severity: Warning, Subject: fmt.Sprintf("GPU %d %s", g.Index, g.UUID),
				Summary:  "a CUDA process outside any pod holds this GPU: its memory and time are in no slice's account",
				Evidence: evidence,
				Remedy:   "Stop it (kill the pid) or run it as a pod through tessera-scheduler; with MPS, a process outside the agent's daemon also blocks the GPU's exclusive-process mode."})
		}
	}
	if len(f.TesseraSpecs) > 0 && len(f.Kubelet.TesseraSockets) == 0 {
		out = append(out, Finding{ID: "leftovers.cdi-specs", Severity: Warning, Summary: fmt.Sprintf("%d Tessera slot spec(s) in /var/run/cdi with no tessera-agent registered", len(f.TesseraSpecs)),
			Evidence: strings.Join(f.TesseraSpecs[:min(3, len(f.TesseraSpecs))], " "),
			Remedy:   "A running agent collects them every 30 s; with Tessera uninstalled, delete /var/run/cdi/tessera-*.json."})
	}
	return out
}
