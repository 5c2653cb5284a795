package doctor

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/cgroup"
	"github.com/tessera-gpu/tessera/pkg/nvml"
)

// Paths on a node, relative to its root (fs.FS paths have no leading /).
const (
	pathOSRelease        = "proc/sys/kernel/osrelease"
	pathCgroupRoot       = "sys/fs/cgroup"
	pathDevicePlugins    = "var/lib/kubelet/device-plugins"
	pathPodResources     = "var/lib/kubelet/pod-resources/kubelet.sock"
	pathKubeletConfig    = "var/lib/kubelet/config.yaml"
	pathContainerd       = "etc/containerd/config.toml"
	pathCRIO             = "etc/crio/crio.conf"
	pathNvidiaRuntimeCfg = "etc/nvidia-container-runtime/config.toml"
	pathMPSRoot          = "run/tessera/mps"
	pathCDI              = "var/run/cdi"
)

// Programs looked up on the node, by their usual places.
var (
	mpsControlPaths    = []string{"usr/bin/nvidia-cuda-mps-control", "usr/local/nvidia/bin/nvidia-cuda-mps-control", "run/nvidia/driver/usr/bin/nvidia-cuda-mps-control"}
	nvidiaSMIPaths     = []string{"usr/bin/nvidia-smi", "usr/local/nvidia/bin/nvidia-smi", "run/nvidia/driver/usr/bin/nvidia-smi"}
	nvidiaRuntimePaths = []string{"usr/bin/nvidia-container-runtime", "usr/local/nvidia/toolkit/nvidia-container-runtime"}
	cdiHookPaths       = []string{"usr/bin/nvidia-cdi-hook", "usr/bin/nvidia-ctk", "usr/local/nvidia/toolkit/nvidia-cdi-hook"}
)

// NodeFacts is what the node checks judge, read once.
type NodeFacts struct {
	// KernelRelease is uname -r; KernelErr why it could not be read.
	KernelRelease string
	KernelErr     error
	// CgroupControllers are the root cgroup v2 hierarchy's controllers;
	// CgroupErr says why there is none.
	CgroupControllers []string
	CgroupErr         error

	// NVMLErr says why the driver could not be read; then Driver is empty.
	NVMLErr error
	Driver  string
	// CUDA is the CUDA driver API version (12090 for 12.9).
	CUDA int
	GPUs []GPUFacts

	MPSControl    string // path, empty when not found
	NvidiaSMI     string
	MPSDaemons    []MPSDaemonFacts
	NvidiaRuntime string
	CDIHook       string
	// RuntimeConfig is the NVIDIA container runtime's config.toml, nil
	// when absent; RuntimeConfigErr when unreadable.
	RuntimeConfig    map[string]any
	RuntimeConfigErr error

	Kubelet    KubeletFacts
	Containerd *ContainerdFacts // nil when no config file
	CRIO       bool
	// TesseraSpecs are the slot CDI specs in /var/run/cdi.
	TesseraSpecs []string
}

// GPUFacts is one GPU as NVML reads it.
type GPUFacts struct {
	Index       int
	UUID        string
	Model       string
	MIG         bool
	ComputeMode gonvml.ComputeMode
	// Persistence: nil when unreadable.
	Persistence *bool
	// KernelLimits: NVML's per-cgroup memory limits answer on this GPU;
	// KernelLimitsErr when the question could not be asked.
	KernelLimits    bool
	KernelLimitsErr error
	// Processes hold a CUDA context on the GPU.
	Processes []GPUProcess
}

// GPUProcess is a process on a GPU and where it runs.
type GPUProcess struct {
	PID  uint32
	Comm string
	// PodUID is the pod whose cgroup holds it; empty for a process outside
	// Kubernetes (Err says why when /proc could not be read).
	PodUID string
	Err    error
}

// MPSDaemonFacts is one of the agent's MPS daemons, from its directory.
type MPSDaemonFacts struct {
	UUID string
	// Pipe: its control pipe exists (the daemon is up).
	Pipe bool
	// LogTail is the control log's last lines.
	LogTail []string
	// Queried: the daemon was asked for its servers and their clients;
	// QueryErr is its failure to answer.
	Queried  bool
	QueryErr error
	Servers  []MPSServer
}

// MPSServer is one MPS server of a daemon and its clients' PIDs.
type MPSServer struct {
	PID     string
	Clients []string
}

// MPSQuery sends a command to a GPU's MPS daemon through its control
// program and returns the reply (mps.Manager.Control).
type MPSQuery func(uuid, command string) (string, error)

// KubeletFacts is what kubelet leaves on the node.
type KubeletFacts struct {
	DevicePluginDir bool
	KubeletSocket   bool
	// TesseraSockets are tessera-agent's registered plugin sockets.
	TesseraSockets []string
	PodResources   bool
	// Config is kubelet's config file, nil when absent.
	Config    map[string]any
	ConfigErr error
	// Args are the running kubelet's command line, nil when none runs.
	Args []string
}

// ContainerdFacts is containerd's CRI settings that matter here.
type ContainerdFacts struct {
	// Version is the config's schema version (2: containerd 1.x, 3: 2.x).
	Version int
	// EnableCDI: nil when not set (the default: off before 2.0, on from
	// 2.0).
	EnableCDI   *bool
	CDISpecDirs []string
	// Path is the config read ("/etc/containerd/config.toml" unless the
	// running containerd names another with --config), and Imports the
	// drop-ins it imports that were read after it.
	Path    string
	Imports []string
	Err     error
}

// GatherNode reads a node's facts from root (the node's / as an fs.FS) and
// lib (the driver's NVML, or nil with libErr saying why there is none);
// query, when given, asks each MPS daemon for its servers and clients.
func GatherNode(root fs.FS, lib gonvml.Interface, libErr error, query MPSQuery) NodeFacts {
	var f NodeFacts
	if b, err := fs.ReadFile(root, pathOSRelease); err != nil {
		f.KernelErr = err
	} else {
		f.KernelRelease = strings.TrimSpace(string(b))
	}
	if b, err := fs.ReadFile(root, path.Join(pathCgroupRoot, "cgroup.controllers")); err != nil {
		f.CgroupErr = err
	} else {
		f.CgroupControllers = strings.Fields(string(b))
	}
	f.gatherNVML(root, lib, libErr)
	f.MPSControl = firstExisting(root, mpsControlPaths)
	f.NvidiaSMI = firstExisting(root, nvidiaSMIPaths)
	f.NvidiaRuntime = firstExisting(root, nvidiaRuntimePaths)
	f.CDIHook = firstExisting(root, cdiHookPaths)
	if b, err := fs.ReadFile(root, pathNvidiaRuntimeCfg); err == nil {
		f.RuntimeConfig = map[string]any{}
		if _, err := toml.Decode(string(b), &f.RuntimeConfig); err != nil {
			f.RuntimeConfig, f.RuntimeConfigErr = nil, fmt.Errorf("/%s: %w", pathNvidiaRuntimeCfg, err)
		}
	}
	f.MPSDaemons = gatherMPS(root)
	if query != nil {
		for i := range f.MPSDaemons {
			f.MPSDaemons[i].ask(query)
		}
	}
	f.Kubelet = gatherKubelet(root)
	if p := containerdConfigPath(root); p != "" {
		if b, err := fs.ReadFile(root, p); err == nil {
			f.Containerd = parseContainerd(b)
			f.Containerd.Path = "/" + p
			readContainerdImports(root, p, b, f.Containerd)
		}
	}
	if _, err := fs.Stat(root, pathCRIO); err == nil {
		f.CRIO = true
	} else if entries, err := fs.ReadDir(root, pathCRIO+".d"); err == nil && len(entries) > 0 {
		f.CRIO = true
	}
	f.TesseraSpecs, _ = fs.Glob(root, path.Join(pathCDI, "tessera-*.json"))
	return f
}

func (f *NodeFacts) gatherNVML(root fs.FS, lib gonvml.Interface, libErr error) {
	if lib == nil {
		f.NVMLErr = libErr
		if f.NVMLErr == nil {
			f.NVMLErr = errors.New("no NVML library given")
		}
		return
	}
	c, err := nvml.New(lib)
	if err != nil {
		f.NVMLErr = err
		return
	}
	defer c.Close()
	if f.Driver, f.CUDA, err = c.DriverVersion(); err != nil && f.Driver == "" {
		f.NVMLErr = err
		return
	}
	devs, err := c.Devices()
	if err != nil && len(devs) == 0 {
		f.NVMLErr = err
		return
	}
	for _, d := range devs {
		g := GPUFacts{Index: d.Index, UUID: d.UUID, Model: d.Model, MIG: d.MIGEnabled, ComputeMode: d.ComputeMode}
		if on, err := c.PersistenceMode(d.UUID); err == nil {
			g.Persistence = &on
		}
		g.KernelLimits, g.KernelLimitsErr = c.MemoryLimitsOffered(d.UUID, "/"+pathCgroupRoot)
		if pids, err := c.Processes(d.UUID); err == nil {
			for _, pid := range pids {
				g.Processes = append(g.Processes, gpuProcess(root, pid))
			}
		}
		f.GPUs = append(f.GPUs, g)
	}
}

// gpuProcess reads where a GPU process runs from its /proc entry.
func gpuProcess(root fs.FS, pid uint32) GPUProcess {
	p := GPUProcess{PID: pid}
	dir := path.Join("proc", strconv.FormatUint(uint64(pid), 10))
	if b, err := fs.ReadFile(root, path.Join(dir, "comm")); err == nil {
		p.Comm = strings.TrimSpace(string(b))
	}
	b, err := fs.ReadFile(root, path.Join(dir, "cgroup"))
	if err != nil {
		p.Err = err
		return p
	}
	if ref, err := cgroup.Parse(string(b)); err == nil {
		p.PodUID = ref.PodUID
	}
	return p
}

func firstExisting(root fs.FS, paths []string) string {
	for _, p := range paths {
		if st, err := fs.Stat(root, p); err == nil && !st.IsDir() {
			return "/" + p
		}
	}
	return ""
}

// ask queries a daemon whose pipe exists: get_server_list, then each
// server's get_client_list.
func (d *MPSDaemonFacts) ask(query MPSQuery) {
	if !d.Pipe {
		return
	}
	d.Queried = true
	out, err := query(d.UUID, "get_server_list")
	if err != nil {
		d.QueryErr = fmt.Errorf("get_server_list: %w (%s)", err, out)
		return
	}
	for _, pid := range strings.Fields(out) {
		s := MPSServer{PID: pid}
		if clients, err := query(d.UUID, "get_client_list "+pid); err == nil {
			s.Clients = strings.Fields(clients)
		}
		d.Servers = append(d.Servers, s)
	}
}

// MPSControlPath is the MPS control program on the node under root, empty
// when none was found.
func MPSControlPath(root fs.FS) string { return firstExisting(root, mpsControlPaths) }

// AgentRunsMPS says whether tessera-agent runs MPS on the node under root:
// its MPS directory holds a GPU's daemon directory.
func AgentRunsMPS(root fs.FS) bool { return len(gatherMPS(root)) > 0 }

// gatherMPS reads the agent's MPS directory: one subdirectory per GPU with
// pipe/ and log/control.log.
func gatherMPS(root fs.FS) []MPSDaemonFacts {
	entries, err := fs.ReadDir(root, pathMPSRoot)
	if err != nil {
		return nil
	}
	var out []MPSDaemonFacts
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "GPU-") {
			continue
		}
		d := MPSDaemonFacts{UUID: e.Name()}
		if _, err := fs.Stat(root, path.Join(pathMPSRoot, e.Name(), "pipe", "control")); err == nil {
			d.Pipe = true
		}
		if b, err := fs.ReadFile(root, path.Join(pathMPSRoot, e.Name(), "log", "control.log")); err == nil {
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			d.LogTail = lines[max(0, len(lines)-5):]
		}
		out = append(out, d)
	}
	return out
}

func gatherKubelet(root fs.FS) KubeletFacts {
	var k KubeletFacts
	if st, err := fs.Stat(root, pathDevicePlugins); err == nil && st.IsDir() {
		k.DevicePluginDir = true
		entries, _ := fs.ReadDir(root, pathDevicePlugins)
		for _, e := range entries {
			switch {
			case e.Name() == "kubelet.sock":
				k.KubeletSocket = true
			case strings.HasPrefix(e.Name(), "tessera-") && strings.HasSuffix(e.Name(), ".sock"):
				k.TesseraSockets = append(k.TesseraSockets, e.Name())
			}
		}
	}
	if _, err := fs.Stat(root, pathPodResources); err == nil {
		k.PodResources = true
	}
	if b, err := fs.ReadFile(root, pathKubeletConfig); err == nil {
		k.Config = map[string]any{}
		if err := yaml.Unmarshal(b, &k.Config); err != nil {
			k.Config, k.ConfigErr = nil, fmt.Errorf("/%s: %w", pathKubeletConfig, err)
		}
	}
	k.Args = kubeletArgs(root)
	return k
}

// kubeletArgs finds the running kubelet in /proc and returns its command
// line.
func kubeletArgs(root fs.FS) []string {
	entries, err := fs.ReadDir(root, "proc")
	if err != nil {
		return nil
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := fs.ReadFile(root, path.Join("proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "kubelet" {
			continue
		}
		cmdline, err := fs.ReadFile(root, path.Join("proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		return strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	}
	return nil
}

// containerdConfigPath is where containerd reads its config, relative to
// root: what the running containerd was given with --config (or -c), as
// its command line in /proc says (k3s, RKE2 and others start it with their
// own), else the default /etc/containerd/config.toml.
func containerdConfigPath(root fs.FS) string {
	cmdlines, _ := fs.Glob(root, "proc/[0-9]*/cmdline")
	for _, c := range cmdlines {
		b, err := fs.ReadFile(root, c)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if path.Base(args[0]) != "containerd" {
			continue
		}
		for i, a := range args[1:] {
			var p string
			switch {
			case (a == "--config" || a == "-c") && i+2 < len(args):
				p = args[i+2]
			case strings.HasPrefix(a, "--config="):
				p = strings.TrimPrefix(a, "--config=")
			case strings.HasPrefix(a, "-c="):
				p = strings.TrimPrefix(a, "-c=")
			}
			if p != "" {
				return strings.TrimPrefix(path.Clean(p), "/")
			}
		}
	}
	return pathContainerd
}

// readContainerdImports applies the drop-ins the config at p (its content
// b) imports, in order, as containerd does: a later file's CRI settings
// replace the earlier ones'. Import paths may be globs, relative to the
// config's directory.
func readContainerdImports(root fs.FS, p string, b []byte, c *ContainerdFacts) {
	var cfg struct {
		Imports []string `toml:"imports"`
	}
	if _, err := toml.NewDecoder(bytes.NewReader(b)).Decode(&cfg); err != nil {
		return
	}
	for _, imp := range cfg.Imports {
		if !path.IsAbs(imp) {
			imp = path.Join("/", path.Dir(p), imp)
		}
		matches, _ := fs.Glob(root, strings.TrimPrefix(path.Clean(imp), "/"))
		for _, m := range matches {
			data, err := fs.ReadFile(root, m)
			if err != nil {
				continue
			}
			d := parseContainerd(data)
			if d.Err != nil {
				c.Err = fmt.Errorf("%s: %w", "/"+m, d.Err)
				continue
			}
			if d.EnableCDI != nil {
				c.EnableCDI = d.EnableCDI
			}
			if len(d.CDISpecDirs) > 0 {
				c.CDISpecDirs = d.CDISpecDirs
			}
			c.Imports = append(c.Imports, "/"+m)
		}
	}
}

// parseContainerd reads the CRI plugin's CDI settings from containerd's
// config: version 2 ("io.containerd.grpc.v1.cri") and 3
// ("io.containerd.cri.v1.runtime").
func parseContainerd(b []byte) *ContainerdFacts {
	c := &ContainerdFacts{Version: 1}
	var cfg map[string]any
	if _, err := toml.NewDecoder(bytes.NewReader(b)).Decode(&cfg); err != nil {
		c.Err = err
		return c
	}
	if v, ok := cfg["version"].(int64); ok {
		c.Version = int(v)
	}
	plugins, _ := cfg["plugins"].(map[string]any)
	for _, name := range []string{"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"} {
		p, ok := plugins[name].(map[string]any)
		if !ok {
			continue
		}
		if v, ok := p["enable_cdi"].(bool); ok {
			c.EnableCDI = &v
		}
		if dirs, ok := p["cdi_spec_dirs"].([]any); ok {
			for _, d := range dirs {
				if s, ok := d.(string); ok && !slices.Contains(c.CDISpecDirs, s) {
					c.CDISpecDirs = append(c.CDISpecDirs, s)
				}
			}
		}
	}
	return c
}
