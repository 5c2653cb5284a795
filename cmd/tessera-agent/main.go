// Command tessera-agent is Tessera's node agent: it watches the node's GPUs
// through NVML, serves the tessera.dev/gpu device plugin to kubelet, runs the
// MPS daemons, publishes the node's GPU inventory for tessera-scheduler and
// exports Prometheus metrics. It runs as a privileged DaemonSet pod with the
// host PID namespace, kubelet's device-plugin and pod-resources directories
// and the CDI spec directory mounted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/tessera-gpu/tessera/pkg/agent"
	"github.com/tessera-gpu/tessera/pkg/agent/deviceplugin"
	"github.com/tessera-gpu/tessera/pkg/agent/dra"
	"github.com/tessera-gpu/tessera/pkg/agent/mps"
	"github.com/tessera-gpu/tessera/pkg/agent/nodepods"
	"github.com/tessera-gpu/tessera/pkg/agent/refusal"
	"github.com/tessera-gpu/tessera/pkg/agent/shim"
	"github.com/tessera-gpu/tessera/pkg/agent/timeslice"
	"github.com/tessera-gpu/tessera/pkg/agentendpoint"
	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/nvml"
	"github.com/tessera-gpu/tessera/pkg/version"
)

const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2 // bad flags or configuration
	exitNoDriver = 3 // NVML could not load and --allow-no-gpu is off
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// newNVML opens the driver's NVML; tests replace it.
var newNVML = func() gonvml.Interface { return gonvml.New() }

func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("tessera-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configPath   = fs.String("config", "", "TesseraConfiguration file (tessera.dev/v1alpha1); defaults when empty")
		node         = fs.String("node", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
		kubeconfig   = fs.String("kubeconfig", "", "kubeconfig; in-cluster configuration when empty")
		metricsAddr  = fs.String("metrics-addr", agentendpoint.DefaultMetricsAddr, "address of the Prometheus endpoint (and GET /doctor); not DCGM exporter's 9400")
		pluginDir    = fs.String("device-plugin-dir", pluginapi.DevicePluginPath, "kubelet's device-plugin directory")
		podResources = fs.String("pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "kubelet's pod-resources socket")
		cdiDir       = fs.String("cdi-dir", "/var/run/cdi", "where the slots' CDI specs are written")
		procRoot     = fs.String("proc", "/proc", "the host's /proc (host PID namespace)")
		useMPS       = fs.Bool("mps", false, "run every GPU in MPS mode (one control daemon per GPU)")
		mpsRoot      = fs.String("mps-root", "/run/tessera/mps", "holds each MPS daemon's pipe and log directories")
		mpsBinary    = fs.String("mps-control", mps.DefaultBinary, "the MPS control program")
		allowNoGPU   = fs.Bool("allow-no-gpu", false, "run as an empty node when NVML cannot load, instead of exiting")
		nvidiaSMI    = fs.String("nvidia-smi", timeslice.DefaultNvidiaSMI, "the driver's nvidia-smi, which sets time-shared GPUs' time-slice class")
		schedulers   = fs.String("scheduler-names", strings.Join(deviceplugin.DefaultSchedulerNames, ","), "the scheduler profiles that run TesseraGPU, comma-separated: an assignment on a pod naming another scheduler is refused")
		showVersion  = fs.Bool("version", false, "print the version and exit")
		noticeRoot   = fs.String("preemption-dir", "/run/tessera/preemption", "holds each pod's preemption notice directory, mounted into its GPU containers (empty: no preemption notices)")
		cgroupRoot   = fs.String("cgroup-root", "/sys/fs/cgroup", "the host's cgroup v2 hierarchy, where pods' kernel GPU memory limits are set (empty: none are set, and the inventory says so)")
		driverRoot   = fs.String("driver-root", "/", "where the NVIDIA driver's files are, at the same paths as on the host; NVIDIA's CDI generator puts its device nodes and libraries into every slot spec (empty: GPU containers rest on NVIDIA_VISIBLE_DEVICES)")
		namespace    = fs.String("namespace", envOr("POD_NAMESPACE", agentendpoint.Namespace), "the namespace of the agent's heartbeat Lease (default $POD_NAMESPACE, else tessera-system)")
		hostRoot     = fs.String("host-root", "/", "the host's file system as the agent sees it (its /proc with hostPID, /sys, kubelet's directories): tessera doctor's node checks run there at start and on GET /doctor (empty: off)")
		cdiHook      = fs.String("cdi-hook", "", "nvidia-cdi-hook on the host (the NVIDIA container toolkit's default, /usr/bin/nvidia-cdi-hook, when empty)")
		shimDir      = fs.String("shim-dir", "/run/tessera/shim", "on the host, where the agent keeps libtessera and each container's limits, mounted into the containers of slices it holds (empty: it is put in no container, and those slices are accounted only)")
		shimLibrary  = fs.String("shim-library", shim.DefaultLibrary, "libtessera as the agent's image has it, copied into --shim-dir at start")
		draMode      = fs.String("dra", string(agent.DRANever), "serve this node's GPUs through the DRA driver gpu.tessera.dev instead of the device plugin: never, always, or node-label (where the Node is labelled "+dra.NodeLabel+"=true when the agent starts)")
		draDir       = fs.String("dra-plugin-dir", dra.DefaultPluginDir, "the DRA driver's socket and its checkpoint of prepared claims, on the host")
		registryDir  = fs.String("plugin-registry-dir", dra.DefaultRegistryDir, "kubelet's plugin registration directory, where the DRA driver registers")
		refusedGrace = fs.Duration("refused-grace", refusal.DefaultGrace, "how long a pod refused its GPUs (no Tessera assignment, another scheduler's, or one the node cannot honour) may hold its slots before the agent deletes it")
	)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, version.String("tessera-agent"))
		return exitOK
	}
	cfg := config.Default()
	if *configPath != "" {
		b, err := os.ReadFile(*configPath)
		if err != nil {
			fmt.Fprintf(stderr, "tessera-agent: %v\n", err)
			return exitUsage
		}
		if cfg, err = config.Load(b); err != nil {
			fmt.Fprintf(stderr, "tessera-agent: %s: %v\n", *configPath, err)
			return exitUsage
		}
	}
	var schedulerNames []string
	for _, n := range strings.Split(*schedulers, ",") {
		if n = strings.TrimSpace(n); n != "" {
			schedulerNames = append(schedulerNames, n)
		}
	}
	if len(schedulerNames) == 0 {
		fmt.Fprintf(stderr, "tessera-agent: --scheduler-names %q names no scheduler profile; the default is %s\n", *schedulers, strings.Join(deviceplugin.DefaultSchedulerNames, ","))
		return exitUsage
	}
	mode, err := agent.ParseDRAMode(*draMode)
	if err != nil {
		fmt.Fprintf(stderr, "tessera-agent: --dra %v\n", err)
		return exitUsage
	}
	if *refusedGrace <= 0 {
		fmt.Fprintf(stderr, "tessera-agent: --refused-grace %s: give a positive duration, such as %s\n", *refusedGrace, refusal.DefaultGrace)
		return exitUsage
	}
	if *node == "" {
		fmt.Fprintln(stderr, "tessera-agent: --node (or $NODE_NAME, from the downward API) is required")
		return exitUsage
	}
	restCfg, err := restConfig(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "tessera-agent: %v\n", err)
		return exitUsage
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		fmt.Fprintf(stderr, "tessera-agent: %v\n", err)
		return exitError
	}

	// This node's pods: their assignments (device plugin), container IDs
	// (per-tenant metrics) and preemption notices.
	nodePods := nodepods.Watch(client, *node)
	conn, err := grpc.NewClient("unix://"+*podResources, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(stderr, "tessera-agent: pod-resources: %v\n", err)
		return exitError
	}
	defer conn.Close()

	a, err := agent.New(agent.Options{
		Node: *node, Config: cfg, Client: client, NVML: newNVML(), AllowNoGPU: *allowNoGPU,
		MPS: *useMPS, MPSBinary: *mpsBinary, MPSRoot: *mpsRoot, SchedulerNames: schedulerNames,
		Holder: deviceplugin.PodResourcesHolder{Client: podresourcesapi.NewPodResourcesListerClient(conn)},
		Pods:   nodePods.Get, CDIDir: *cdiDir, ProcRoot: *procRoot, NodePods: nodePods.List, AssignmentChanges: nodePods.Changes, NoticeRoot: *noticeRoot,
		NvidiaSMI: *nvidiaSMI, CgroupRoot: *cgroupRoot, DriverRoot: *driverRoot, CDIHookPath: *cdiHook, Namespace: *namespace, HostRoot: *hostRoot,
		RefusedGrace: *refusedGrace, ShimRoot: *shimDir, ShimLibrary: *shimLibrary,
		DRA: agent.DRAOptions{Mode: mode, PluginDir: *draDir, RegistryDir: *registryDir},
	})
	switch {
	case errors.Is(err, nvml.ErrNoDriver):
		fmt.Fprintf(stderr, "tessera-agent: %v (run with --allow-no-gpu to serve an empty node)\n", err)
		return exitNoDriver
	case err != nil:
		fmt.Fprintf(stderr, "tessera-agent: %v\n", err)
		return exitError
	}
	nodePods.Factory.Start(ctx.Done())
	nodePods.Factory.WaitForCacheSync(ctx.Done())
	if err := a.Run(klog.NewContext(ctx, klog.Background()), *pluginDir, *metricsAddr); err != nil {
		fmt.Fprintf(stderr, "tessera-agent: %v\n", err)
		return exitError
	}
	return exitOK
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a cluster and no --kubeconfig: %w", err)
	}
	return c, nil
}

// envOr is the variable's value, or def when it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
