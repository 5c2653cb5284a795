package main

import (
	"fmt"
	"github.com/spf13/cobra"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/term"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
	"github.com/tessera-gpu/tessera/pkg/sim"
)

const simLong = `Replays a pod list on a cluster through Tessera's allocator, the way the FGD
paper's simulator does (USENIX ATC'23): every pod of the list plus pods drawn
at random until GPU demand reaches --tune × capacity, shuffled by the seed,
placed one at a time, never deleted. Prints a summary per policy (mean over
seeds); --out writes the allocation curve CSV in the paper's format, --plot a
PNG. Without --nodes and --pods it replays the built-in synthetic workload.`

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
		if !config.KnownPolicy(config.Policy(name)) {
			return fmt.Errorf("unknown policy %q (want all or one of %s)", name, strings.Join(policyNames(), ", "))
		}
		*p = append(*p, config.Policy(name))
	}
	return nil
}

func policyNames() []string {
	names := make([]string, len(config.Policies))
	for i, p := range config.Policies {
		names[i] = string(p)
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
	)
	fs.Var(&policies, "policy", "scoring policy, repeatable or comma-separated: "+strings.Join(policyNames(), ", ")+" or all (default all)")
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
			var results []*sim.Result
			for _, pol := range policies {
				for _, seed := range seeds {
					res, err := trace.Run(cfg.Allocator, sim.RunOptions{
						Policy: pol, Seed: seed, Tune: *tune, Plain: *plain,
						Progress: func(done, total int) { bar.update(fmt.Sprintf("%s seed %d", pol, seed), done, total) },
					})
					if err != nil {
						bar.done()
						fmt.Fprintf(stderr, "tessera sim: %v\n", err)
						return exitError
					}
					bar.finishRun()
					results = append(results, res)
				}
			}
			bar.done()

			if *out != "" {
				if err := writeCSV(*out, stdout, results); err != nil {
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
			for _, seed := range seeds {
				ceilings = append(ceilings, trace.CeilingOf(seed, *tune))
			}
			if err := sim.WriteCeiling(summaryOut, trace.GPUs(), ceilings); err != nil {
				return exitError
			}
			return exitOK
		}()
		return nil
	}
	return cmd
}

// workloadName labels a pod list the way the paper's CSVs do:
// openb_pod_list_gpushare40.csv → gpushare40.
func workloadName(path string) string {
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	return strings.TrimPrefix(base, "openb_pod_list_")
}

func writeCSV(path string, stdout io.Writer, results []*sim.Result) error {
	if path == "-" {
		return sim.WriteCSV(stdout, results)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := sim.WriteCSV(f, results); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
