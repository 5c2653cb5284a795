package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/sim"
)

const simLong = `Replays a pod list on a cluster through Tessera's allocator, the way the FGD
paper's simulator does (USENIX ATC'23): every pod of the list plus pods drawn
at random until GPU demand reaches --tune × capacity, shuffled by the seed,
placed one at a time, never deleted. Prints a summary per policy (mean over
seeds); --out writes the allocation curve CSV in the paper's format, --plot a
PNG. Without --nodes and --pods it replays the built-in synthetic workload.

With --timeline it replays the list by time instead: each pod arrives at its
creation_time (divided by --speedup) and stays its lifetime (deletion_time −
creation_time) from when it is placed; a pod that fits nowhere waits in a
queue and is retried when a pod leaves, as kube-scheduler retries. It prints
per policy the GPU allocation over the arrival window (time-weighted mean and
5th percentile), the queueing delay (p50, p99), the pods queued and never
placed, and the mean fragmentation; --out writes the curves as CSV, --plot
allocation and queue length over time for every policy on one picture.`

// policyList is a repeatable --policy flag.
type policyList []config.Policy

func (p *policyList) String() string {
	s := make([]string, len(*p))
	for i, v := range *p {
		s[i] = string(v)
	}
	return strings.Join(s, ",")
}

// Type names the flag's value in help, as pflag wants.
func (p *policyList) Type() string { return "policies" }

func (p *policyList) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "all" {
			*p = append(*p, config.Policies...)
			continue
		}
		if !config.SimPolicy(config.Policy(name)) {
			return fmt.Errorf("unknown policy %q (want all or one of %s)", name, strings.Join(policyNames(), ", "))
		}
		*p = append(*p, config.Policy(name))
	}
	return nil
}

func policyNames() []string {
	var names []string
	for _, p := range append(slices.Clone(config.Policies), config.ComparisonPolicies...) {
		names = append(names, string(p))
	}
	return names
}

func newSimCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Replay a trace (or the built-in workload) through the allocator",
		Long:  simLong,
		Args:  cobra.NoArgs,
	}

	fs := cmd.Flags()
	var (
		policies   policyList
		nodesPath  = fs.String("nodes", "", "node list CSV (columns sn,cpu_milli,memory_mib,gpu,model)")
		podsPath   = fs.String("pods", "", "pod list CSV (columns name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])")
		seedsFlag  = fs.String("seeds", "42-51", "seeds: a range 42-51, a list 42,43 or both")
		tune       = fs.Float64("tune", 1.3, "inflate (or deflate) GPU demand to this multiple of capacity")
		out        = fs.String("out", "", "write the allocation curve CSV here ('-' for standard output)")
		plotPath   = fs.String("plot", "", "write a PNG plot of allocation against arrived demand here")
		configPath = fs.String("config", "", "Tessera configuration file (tessera.dev/v1alpha1); its allocator section applies")
		synthNodes = fs.Int("synthetic-nodes", 128, "built-in workload: number of GPU nodes")
		synthPods  = fs.Int("synthetic-pods", 2000, "built-in workload: number of pods before tuning")
		synthSeed  = fs.Uint64("synthetic-seed", 1, "built-in workload: generator seed")
		plain      = fs.Bool("plain", false, "score every node for every pod without the per-node cache (same placements, slower)")
		progress   = fs.Bool("progress", term.IsTerminal(int(os.Stderr.Fd())), "show a progress bar on standard error")
		timeline   = fs.Bool("timeline", false, "replay the pod list by its creation_time and deletion_time, with a queue, instead of the arrival replay")
		speedup    = fs.Float64("speedup", 1, "with --timeline: divide creation times (not lifetimes) by this, so the same pods contend harder")
	)
	fs.Var(&policies, "policy", "scoring policy, repeatable or comma-separated: "+strings.Join(policyNames(), ", ")+" or all (default all: every policy but "+string(config.PolicyFirstFit)+", upstream DRA's first-fit device choice, replayed only when named)")
	cmd.RunE = func(*cobra.Command, []string) error {
		*code = func() int {
			usageErr := func(format string, a ...any) int {
				fmt.Fprintf(stderr, "tessera sim: "+format+"\n", a...)
				return exitUsage
			}
			if len(policies) == 0 {
				policies = config.Policies
			}
			seeds, err := sim.ParseSeeds(*seedsFlag)
			if err != nil {
				return usageErr("%v", err)
			}
			if *timeline {
				for _, f := range []string{"tune", "plain"} {
					if cmd.Flags().Changed(f) {
						return usageErr("--%s applies to the arrival replay, not to --timeline", f)
					}
				}
				if !(*speedup > 0 && *speedup <= 1e6) {
					return usageErr("--speedup %v: must be in (0, 1000000]", *speedup)
				}
			} else if cmd.Flags().Changed("speedup") {
				return usageErr("--speedup goes with --timeline")
			}
			if !(*tune > 0 && *tune <= 10) {
				return usageErr("--tune %v: must be in (0, 10]", *tune)
			}
			if (*nodesPath == "") != (*podsPath == "") {
				return usageErr("--nodes and --pods go together")
			}
			cfg := config.Default()
			if *configPath != "" {
				data, err := os.ReadFile(*configPath)
				if err != nil {
					fmt.Fprintf(stderr, "tessera sim: %v\n", err)
					return exitError
				}
				if cfg, err = config.Load(data); err != nil {
					fmt.Fprintf(stderr, "tessera sim: %s: %v\n", *configPath, err)
					return exitError
				}
			}

			var name string
			var nodes []sim.NodeSpec
			var pods []sim.PodSpec
			if *nodesPath == "" {
				name = "synthetic"
				nodes, pods = sim.Synthetic(sim.SyntheticOptions{Nodes: *synthNodes, Pods: *synthPods, Seed: *synthSeed})
			} else {
				name = workloadName(*podsPath)
				if nodes, err = sim.ReadNodes(*nodesPath); err == nil {
					pods, err = sim.ReadPods(*podsPath)
				}
				if err != nil {
					fmt.Fprintf(stderr, "tessera sim: %v\n", err)
					return exitError
				}
			}
			trace, err := sim.NewTrace(name, nodes, pods, cfg.Allocator.WorkloadCoverage)
			if err != nil {
				fmt.Fprintf(stderr, "tessera sim: %v\n", err)
				return exitError
			}

			bar := newProgressBar(stderr, *progress, len(policies)*len(seeds))
			if *timeline {
				return runTimeline(trace, cfg, policies, seeds, *speedup, *out, *plotPath, bar, stdout, stderr)
			}
			results, err := replayAll(policies, seeds, bar, func(pol config.Policy, seed uint64, progress func(done, total int)) (*sim.Result, error) {
				return trace.Run(cfg.Allocator, sim.RunOptions{Policy: pol, Seed: seed, Tune: *tune, Plain: *plain, Progress: progress})
			})
			if err != nil {
				fmt.Fprintf(stderr, "tessera sim: %v\n", err)
				return exitError
			}

			if *out != "" {
				if err := writeTo(*out, stdout, func(w io.Writer) error { return sim.WriteCSV(w, results) }); err != nil {
					fmt.Fprintf(stderr, "tessera sim: %v\n", err)
					return exitError
				}
			}
			if *plotPath != "" {
				if err := sim.SavePlot(*plotPath, name, results); err != nil {
					fmt.Fprintf(stderr, "tessera sim: %v\n", err)
					return exitError
				}
			}
			summaryOut := stdout
			if *out == "-" {
				summaryOut = stderr
			}
			if err := sim.WriteSummary(summaryOut, name, trace.GPUs(), *tune, sim.Summarize(results)); err != nil {
				return exitError
			}
			var ceilings []sim.Ceiling
			var modelCeilings []sim.ModelCeiling
			// The model-aware ceiling takes up to seconds a seed.
			cbar := newProgressBar(stderr, *progress, len(seeds))
			for _, seed := range seeds {
				cbar.update(fmt.Sprintf("ceilings, seed %d", seed), 0, 1)
				ceilings = append(ceilings, trace.CeilingOf(seed, *tune))
				mc, err := trace.ModelCeilingOf(seed, *tune)
				if err != nil {
					cbar.done()
					fmt.Fprintf(stderr, "tessera sim: seed %d: %v\n", seed, err)
					return exitError
				}
				modelCeilings = append(modelCeilings, mc)
				cbar.finishRun()
			}
			cbar.done()
			if err := sim.WriteCeiling(summaryOut, trace.GPUs(), ceilings); err != nil {
				return exitError
			}
			if err := sim.WriteModelCeiling(summaryOut, trace.GPUs(), modelCeilings); err != nil {
				return exitError
			}
			return exitOK
		}()
		return nil
	}
	return cmd
}

// runTimeline is tessera sim --timeline: every policy × seed replayed by
// time, then the summary, the CSV and the plot asked for.
func runTimeline(trace *sim.Trace, cfg *config.Configuration, policies []config.Policy, seeds []uint64, speedup float64,
	out, plotPath string, bar *progressBar, stdout, stderr io.Writer) int {
	results, err := replayAll(policies, seeds, bar, func(pol config.Policy, seed uint64, progress func(done, total int)) (*sim.TimelineResult, error) {
		return trace.Timeline(cfg.Allocator, sim.TimelineOptions{Policy: pol, Seed: seed, Speedup: speedup, Progress: progress})
	})
	if err != nil {
		fmt.Fprintf(stderr, "tessera sim: %v\n", err)
		return exitError
	}
	summaryOut := stdout
	if out != "" {
		if err := writeTo(out, stdout, func(w io.Writer) error { return sim.WriteTimelineCSV(w, results) }); err != nil {
			fmt.Fprintf(stderr, "tessera sim: %v\n", err)
			return exitError
		}
		if out == "-" {
			summaryOut = stderr
		}
	}
	if plotPath != "" {
		if err := sim.SaveTimelinePlot(plotPath, trace.Name, results); err != nil {
			fmt.Fprintf(stderr, "tessera sim: %v\n", err)
			return exitError
		}
	}
	if err := sim.WriteTimelineSummary(summaryOut, trace.Name, trace.GPUs(), len(trace.Pods), speedup, sim.SummarizeTimelines(results)); err != nil {
		return exitError
	}
	return exitOK
}

// replayAll runs every policy × seed, in that order, with the bar showing
// each run's progress.
func replayAll[R any](policies []config.Policy, seeds []uint64, bar *progressBar,
	run func(pol config.Policy, seed uint64, progress func(done, total int)) (R, error)) ([]R, error) {
	defer bar.done()
	var out []R
	for _, pol := range policies {
		for _, seed := range seeds {
			res, err := run(pol, seed, func(done, total int) { bar.update(fmt.Sprintf("%s seed %d", pol, seed), done, total) })
			if err != nil {
				return nil, err
			}
			bar.finishRun()
			out = append(out, res)
		}
	}
	return out, nil
}

// writeTo runs write on standard output for "-", else on the file at path.
func writeTo(path string, stdout io.Writer, write func(io.Writer) error) error {
	if path == "-" {
		return write(stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// workloadName labels a pod list the way the paper's CSVs do:
// openb_pod_list_gpushare40.csv → gpushare40.
func workloadName(path string) string {
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	return strings.TrimPrefix(base, "openb_pod_list_")
}
