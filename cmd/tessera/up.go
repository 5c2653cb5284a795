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
	"time"

	"github.com/spf13/cobra"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/agent/mps/mpssim"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/top"
)

// runUp is `tessera up`: a local GPU cluster in this process, until Ctrl-C
// (or, with --demo, until the sample workload is shown).
func newUpCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "A local GPU cluster in this process (--demo: with a sample workload)",
		Long:  "Runs etcd, the API server, tessera-scheduler and one tessera-agent per\nsimulated GPU node in this process, on mock GPUs, until Ctrl-C. Prints a\nkubeconfig for kubectl and tessera top.",
		Args:  cobra.NoArgs,
	}

	fs := cmd.Flags()
	var (
		opts    playground.Options
		demo    = fs.Bool("demo", false, "submit a sample workload, print where it landed, and exit")
		keep    = fs.Bool("keep", false, "with --demo: stay up afterwards until Ctrl-C")
		mps     = fs.Int("mps-nodes", -1, "how many nodes run their GPUs in MPS mode (default: half, rounded up)")
		verbose = fs.IntP("v", "v", 0, "log verbosity of the components (their log goes to $TMPDIR/tessera-up-*.log, kept on exit)")
		webAddr = fs.String("web", "127.0.0.1:0", "address of the live web view of the GPUs (tessera top --web) while the cluster stays up; empty: none")
	)
	fs.IntVar(&opts.Nodes, "nodes", 4, "simulated GPU nodes")
	fs.IntVar(&opts.GPUsPerNode, "gpus-per-node", 8, "GPUs per node (1–8)")
	fs.StringVar(&opts.Model, "gpu-model", "h100", "GPU model of every node: "+strings.Join(playground.Models, ", "))
	fs.IntVar(&opts.DRANodes, "dra-nodes", 0, "how many nodes (the last ones) serve their GPUs through the DRA driver gpu.tessera.dev instead of the device plugin; --demo then also runs a pod asking with a ResourceClaim")
	fs.BoolVar(&opts.DriverKernelLimits, "driver-kernel-limits", false, "simulate a driver whose NVML sets per-cgroup GPU memory limits (newer than R580): time-sliced memory is then held by the kernel, not libtessera")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		*code = func() int {
			opts.MPSNodes = *mps
			if opts.MPSNodes < 0 {
				opts.MPSNodes = (opts.Nodes + 1) / 2
			}
			exe, err := os.Executable()
			if err != nil {
				fmt.Fprintf(stderr, "tessera up: %v\n", err)
				return exitError
			}
			opts.MPSControl = []string{exe, "mps-control"}
			// One replica holding the shipped leader Lease, as an installed
			// tessera-scheduler does: tessera doctor cluster finds it there.
			opts.SchedulerReplicas = 1
			if err := opts.Validate(); err != nil {
				fmt.Fprintf(stderr, "tessera up: %v\n", err)
				return exitUsage
			}

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			dir, err := os.MkdirTemp("", "tessera-up-")
			if err != nil {
				fmt.Fprintf(stderr, "tessera up: %v\n", err)
				return exitError
			}
			defer os.RemoveAll(dir)
			opts.Dir = dir
			// The log outlives the state directory: it is what to read when
			// something went wrong, after the fact.
			logPath, err := componentLog("tessera-up-*.log", *verbose)
			if err != nil {
				fmt.Fprintf(stderr, "tessera up: %v\n", err)
				return exitError
			}
			defer func() {
				klog.Flush()
				fmt.Fprintf(stdout, "Components' log kept at %s\n", logPath)
			}()

			start := time.Now()
			draNote := ""
			if opts.DRANodes > 0 {
				draNote = fmt.Sprintf(", %d serving DRA", opts.DRANodes)
			}
			fmt.Fprintf(stdout, "Starting %d %s nodes × %d GPUs (%d in MPS mode%s) …\n", opts.Nodes, opts.Model, opts.GPUsPerNode, opts.MPSNodes, draNote)
			c, err := playground.Up(ctx, opts)
			if err != nil {
				fmt.Fprintf(stderr, "tessera up: %v (log: %s)\n", err, logPath)
				return exitError
			}
			defer func() {
				fmt.Fprintln(stdout, "Shutting down …")
				c.Down()
			}()
			fmt.Fprintf(stdout, "Cluster up in %.1f s.\n\n", time.Since(start).Seconds())
			var metrics []string
			for _, n := range c.Nodes {
				metrics = append(metrics, n.MetricsURL)
			}
			webLine := ""
			if *webAddr != "" && (!*demo || *keep) {
				collect := collector(c.Client, metrics, func(error) {})
				url, _, err := serveWeb(ctx, *webAddr, os.Getenv("TESSERA_WEB_TOKEN"), stderr, collect)
				if err != nil {
					fmt.Fprintf(stderr, "tessera up: %v\n", err)
					return exitUsage
				}
				webLine = "  Web view:          " + url + "\n"
			}
			if !*demo || *keep {
				fmt.Fprintf(stdout, "  export KUBECONFIG=%s\n"+
					"  kubectl get nodes\n"+
					"  kubectl get pods -A -o wide\n"+
					"  tessera top --kubeconfig %s --metrics %s\n\n"+
					"%s"+
					"  Scheduler metrics: %s (self-signed HTTPS)\n"+
					"  Agent metrics:     %s\n"+
					"  Components' log:   %s\n\n", c.Kubeconfig, c.Kubeconfig, strings.Join(metrics, ","), webLine, c.SchedulerMetricsURL, strings.Join(metrics, " "), logPath)
			}
			if *demo {
				if err := runDemo(ctx, c, start, metrics, opts.DRANodes > 0, stdout); err != nil {
					fmt.Fprintf(stderr, "tessera up: demo: %v\n", err)
					return exitError
				}
				if !*keep {
					return exitOK
				}
			}
			fmt.Fprintln(stdout, "Up. Ctrl-C stops everything and removes", dir)
			<-ctx.Done()
			return exitOK
		}()
		return nil
	}
	return cmd
}

// componentLog makes a log file in $TMPDIR named by pattern, kept on exit,
// and sends the components' klog output there.
func componentLog(pattern string, verbosity int) (string, error) {
	f, err := os.CreateTemp("", pattern)
	if err != nil {
		return "", err
	}
	path := f.Name()
	f.Close()
	return path, logToFile(path, verbosity)
}

// logToFile sends the components' klog output to path: kube-apiserver and
// the scheduler log a great deal, and the terminal is for the user.
func logToFile(path string, verbosity int) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	return fs.Parse([]string{"-logtostderr=false", "-alsologtostderr=false", "-stderrthreshold=FATAL",
		"-one_output=true", "-skip_log_headers=true", "-log_file=" + path, fmt.Sprintf("-v=%d", verbosity)})
}

// runDemo submits the sample workload, waits for it to settle and prints
// the table.
func runDemo(ctx context.Context, c *playground.Cluster, start time.Time, metrics []string, withClaim bool, stdout io.Writer) error {
	specs := playground.DemoWorkload()
	submitted := time.Now()
	if err := playground.Submit(ctx, c.Client, playground.DemoNamespace, specs); err != nil {
		return err
	}
	submittedPods := len(specs)
	if withClaim {
		// A DRA node: one pod asks with a ResourceClaim instead.
		if err := playground.SubmitClaims(ctx, c.Client, playground.DemoNamespace, []playground.ClaimPod{{Name: "claim-slice", MemoryMiB: 10240, Cores: 25}}); err != nil {
			return err
		}
		submittedPods++
	}
	s, err := playground.WaitSettled(ctx, c.Client, playground.DemoNamespace, 60*time.Second)
	if err != nil {
		return err
	}
	if s.FirstRunning.IsZero() {
		return errors.New("no pod of the sample workload reached Running")
	}
	// One sampling pass (500 ms) after the last start gives every tenant
	// its usage series.
	time.Sleep(1500 * time.Millisecond)
	snap, err := top.Collect(ctx, c.Client)
	if err != nil {
		return err
	}
	for _, m := range metrics {
		if err := snap.AddUsage(ctx, m); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "Submitted %d pods; %d Running. First pod Running %.1f s after submission, %.1f s after `tessera up` started.\n\n",
		submittedPods, s.Running, s.FirstRunning.Sub(submitted).Seconds(), s.FirstRunning.Sub(start).Seconds())
	if err := top.Render(stdout, snap); err != nil {
		return err
	}
	for name, why := range s.Waiting {
		fmt.Fprintf(stdout, "not running: %s: %s\n", name, why)
	}
	return nil
}

// runMPSControl is `tessera mps-control`: the playground's stand-in for
// nvidia-cuda-mps-control (see package mpssim).
func runMPSControl(args []string, stdout, stderr io.Writer) int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitError
	}
	return mpssim.Main([]string{exe, "mps-control"}, args, os.Stdin, stdout, stderr)
}
