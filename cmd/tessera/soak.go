package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/soak"
)

// newSoakCmd is `tessera soak`: a playground under a seeded stream of GPU
// pods and faults, its invariants checked after every step.
func newSoakCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Run a playground under churn and faults, checking Tessera's invariants after every step",
		Long: `Starts a playground (as tessera up does) and drives it with a seeded,
randomized stream of GPU pods — every shape, mode, workload class and
priority; some finish by themselves, victims checkpoint, exit or ignore their
notice; a few leave a GPU process that will not die — and faults at random
times: the leader of two tessera-scheduler replicas killed, agents and
kubelets restarted, XIDs and their recovery, MPS daemons told to quit, nodes
removed and re-added, stuck GPU processes reset. After every step it checks,
from what a user could read, that no GPU is over-granted or shared in two
modes, no slot is held twice, every running container's CDI spec is its
assignment, no slice lands on an unhealthy GPU, no two schedulers run at once;
every tenth step, that every pod runs, succeeded or waits with the scheduler's
reason; at the end, with every pod deleted, that nothing is left booked or
behind. Exits 1 on a violation, printing the seed and step; the same seed
replays the events.`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	var (
		opts    playground.Options
		seed    = fs.Uint64("seed", 1, "seed of the event stream")
		events  = fs.Int("events", 10000, "events to run")
		faults  = fs.Int("fault-every", 40, "mean events between faults (0: no faults)")
		bound   = fs.Duration("bound", 45*time.Second, "how long a pod may take to run or to wait with a reason, and the end to drain")
		step    = fs.Duration("step", 20*time.Millisecond, "pause after each event before the checker reads")
		verbose = fs.IntP("v", "v", 0, "log verbosity of the components (their log goes to $TMPDIR/tessera-soak-*.log, kept on exit)")
	)
	fs.IntVar(&opts.Nodes, "nodes", 3, "simulated GPU nodes")
	fs.IntVar(&opts.GPUsPerNode, "gpus-per-node", 4, "GPUs per node (1–8)")
	fs.IntVar(&opts.MPSNodes, "mps-nodes", 1, "nodes running their GPUs in MPS mode")
	fs.IntVar(&opts.DRANodes, "dra-nodes", 1, "nodes (the last ones) serving their GPUs through the DRA driver gpu.tessera.dev; a third of the pods then ask with a ResourceClaim")
	fs.StringVar(&opts.Model, "gpu-model", "h100", "GPU model of every node: "+strings.Join(playground.Models, ", "))
	fs.IntVar(&opts.SchedulerReplicas, "scheduler-replicas", 2, "tessera-scheduler replicas electing a leader (1: one, killed and replaced as a fault)")
	cmd.RunE = func(*cobra.Command, []string) error {
		*code = func() int {
			exe, err := os.Executable()
			if err != nil {
				fmt.Fprintf(stderr, "tessera soak: %v\n", err)
				return exitError
			}
			opts.MPSControl = []string{exe, "mps-control"}
			opts.QuietPeriod = 3 * time.Second
			opts.FastSliceAdjuster = true
			if err := opts.Validate(); err != nil {
				fmt.Fprintf(stderr, "tessera soak: %v\n", err)
				return exitUsage
			}
			if *events <= 0 || *faults < 0 || *bound <= 0 || *step < 0 {
				fmt.Fprintln(stderr, "tessera soak: --events and --bound must be positive, --fault-every and --step not negative")
				return exitUsage
			}
			logPath, err := componentLog("tessera-soak-*.log", *verbose)
			if err != nil {
				fmt.Fprintf(stderr, "tessera soak: %v\n", err)
				return exitError
			}
			defer klog.Flush()
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			fmt.Fprintf(stdout, "Starting %d %s nodes × %d GPUs (%d in MPS mode, %d serving DRA), %d tessera-scheduler replica(s); components' log: %s\n",
				opts.Nodes, opts.Model, opts.GPUsPerNode, opts.MPSNodes, opts.DRANodes, max(opts.SchedulerReplicas, 1), logPath)
			c, err := playground.Up(ctx, opts)
			if err != nil {
				fmt.Fprintf(stderr, "tessera soak: %v (log: %s)\n", err, logPath)
				return exitError
			}
			defer c.Down()
			sum, err := soak.Run(ctx, c, soak.Options{Seed: *seed, Events: *events, FaultEvery: *faults, Bound: *bound, Step: *step,
				Progress: func(done, total int) {
					if done%1000 == 0 {
						fmt.Fprintf(stderr, "  %d/%d events\n", done, total)
					}
				}}, stdout)
			if err != nil {
				fmt.Fprintf(stderr, "tessera soak: %v\n", err)
				return exitError
			}
			sum.Render(stdout)
			if len(sum.Violations) > 0 {
				return exitError
			}
			return exitOK
		}()
		return nil
	}
	return cmd
}
