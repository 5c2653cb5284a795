package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/agent/mps"
	"github.com/tessera-gpu/tessera/pkg/agentendpoint"
	"github.com/tessera-gpu/tessera/pkg/doctor"
)

func newDoctorCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Find what stands between a node or a cluster and working GPU sharing, and say what to do",
		Long: `tessera doctor checks a GPU node (doctor node) or a cluster (doctor cluster)
and prints each finding with its severity, the evidence read and a remedy,
worst first. The exit code is the worst severity: 0 ok or info, 1 warning,
2 error.`,
	}
	cmd.AddCommand(newDoctorNodeCmd(stdout, stderr, code), newDoctorClusterCmd(stdout, stderr, code))
	// Cobra prints a parent's help and succeeds for any word it does not
	// know, so `tessera doctor nodes && echo healthy` said healthy.
	cmd.Args, cmd.SuggestionsMinimumDistance = cobra.ArbitraryArgs, 2
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return fmt.Errorf("%s needs a subcommand: node or cluster", cmd.CommandPath())
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return errors.New(msg)
	}
	return cmd
}

func newDoctorClusterCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	var (
		out       doctorOutput
		o         clusterDoctorOptions
		agents    []string
		insecure  bool
		threshold float64
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Check a cluster: scheduler, agents, pending and refused GPU pods, GPU out-of-memory, stalls, admission policies",
		Long: `Checks a cluster running Tessera: tessera-scheduler leading (its p99
scheduling latency with --scheduler-metrics), an agent with a live heartbeat
and a readable inventory on every GPU node, GPU pods waiting (grouped by the
scheduler's reason) or refused their GPUs by an agent, GPU containers that
ran out of GPU memory (with the slice they had and what held it), GPUs
whose stall ratio is above the threshold, and the admission policies
installed and bound. It reads only what get/list on nodes, pods, events,
leases and admission policies allows.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			if threshold <= 0 || threshold >= 1 {
				return fmt.Errorf("--stall-threshold %v: want a fraction between 0 and 1", threshold)
			}
			cfg, err := o.restConfig()
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			opts := o.ClusterOptions
			opts.AgentMetrics, opts.StallThreshold = agents, threshold
			opts.HTTP = &http.Client{Timeout: out.timeout}
			if insecure {
				opts.HTTP.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // asked for, for self-signed metrics endpoints
			}
			findings := doctor.DiagnoseCluster(context.Background(), client, opts, out.timeout)
			*code = out.write(stdout, stderr, findings)
			return nil
		},
	}
	out.bind(cmd)
	o.clusterFlags = bindClusterFlags(cmd.Flags())
	cmd.Flags().StringVar(&o.Namespace, "tessera-namespace", agentendpoint.Namespace, "Tessera's namespace (the agents' heartbeats, the components' pods)")
	cmd.Flags().StringVar(&o.LeaseNamespace, "lease-namespace", "kube-system", "the namespace of tessera-scheduler's leader Lease (the chart's scheduler.leaseNamespace)")
	cmd.Flags().StringVar(&o.SchedulerMetrics, "scheduler-metrics", "", "tessera-scheduler's metrics URL, for its scheduling latency (tessera up prints it)")
	cmd.Flags().StringSliceVar(&agents, "metrics", nil, "agents' metrics URLs (default: the tessera-agent pods, through the API server's proxy)")
	cmd.Flags().BoolVar(&insecure, "insecure-metrics", false, "do not verify the metrics endpoints' TLS certificates (the scheduler's is self-signed by default)")
	cmd.Flags().Float64Var(&threshold, "stall-threshold", 0.15, "report GPUs whose stall ratio is above this fraction")
	return cmd
}

// clusterDoctorOptions are doctor cluster's options and how to reach the
// cluster.
type clusterDoctorOptions struct {
	doctor.ClusterOptions
	*clusterFlags
}

// mpsQuery asks a GPU's daemon under root through the control program at
// binary; nil when there is none.
func mpsQuery(binary, root string, timeout time.Duration) doctor.MPSQuery {
	if binary == "" {
		return nil
	}
	m := mps.New(mps.Config{Binary: binary, Root: root})
	return func(uuid, command string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return m.Control(ctx, uuid, command)
	}
}

type doctorOutput struct {
	format  string
	timeout time.Duration
}

func (o *doctorOutput) bind(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "table", "table (for people) or json")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 10*time.Second, "how long each check may take")
}

func (o *doctorOutput) validate() error {
	if o.format != "table" && o.format != "json" {
		return fmt.Errorf("--output %q: want table or json", o.format)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %v: want a positive duration", o.timeout)
	}
	return nil
}

// write prints the findings and returns the exit code.
func (o *doctorOutput) write(stdout, stderr io.Writer, fs []doctor.Finding) int {
	var err error
	if o.format == "json" {
		err = doctor.WriteJSON(stdout, fs)
	} else {
		f, isFile := stdout.(*os.File)
		err = doctor.Render(stdout, fs, isFile && term.IsTerminal(int(f.Fd())))
	}
	if err != nil {
		fmt.Fprintf(stderr, "tessera doctor: %v\n", err)
		return exitError
	}
	return doctor.ExitCode(fs)
}

func newDoctorNodeCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	var (
		out  doctorOutput
		root string
		mps  bool
	)
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Check this GPU node: kernel, driver, GPUs, isolation, MPS, kubelet, container runtime",
		Long: `Checks this GPU node as tessera-agent needs it: the kernel and cgroup v2, the
NVIDIA driver and what it offers (MPS client limits, per-cgroup memory
limits, time-slice classes), every GPU's persistence, MIG and compute mode,
the MPS daemons, kubelet (sockets, Tessera's registration, settings that no
longer exist), the container runtime's CDI and the NVIDIA container toolkit,
and leftovers. It reads only; run it as root on the node (or in a pod with
the host's / mounted at --root and NVML from the NVIDIA runtime).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			if st, err := os.Stat(root); err != nil || !st.IsDir() {
				return fmt.Errorf("--root %q: not a directory", root)
			}
			o := doctor.NodeOptions{MPS: mps}
			fsys := os.DirFS(root)
			if !c.Flags().Changed("mps") {
				// The agent's MPS directories say whether it runs MPS.
				o.MPS = doctor.AgentRunsMPS(fsys)
			}
			var query doctor.MPSQuery
			if root == "/" {
				// Ask the agent's daemons through their control program,
				// as the agent does (read-only commands).
				query = mpsQuery(doctor.MPSControlPath(fsys), "/run/tessera/mps", out.timeout)
			}
			findings := doctor.DiagnoseNode(context.Background(), fsys, newNVML(), nil, query, o, out.timeout)
			*code = out.write(stdout, stderr, findings)
			return nil
		},
	}
	out.bind(cmd)
	cmd.Flags().StringVar(&root, "root", "/", "the node's root file system (its /proc, /sys, /etc, /var/lib/kubelet)")
	cmd.Flags().BoolVar(&mps, "mps", false, "the node runs MPS (default: whether tessera-agent's MPS directories exist under /run/tessera/mps)")
	return cmd
}
