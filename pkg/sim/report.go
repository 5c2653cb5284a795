package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

// WriteCSV writes results in the FGD paper's format:
// workload,sc_policy,tune,seed,total_gpus,0,1,…,N — allocation % at each
// integer arrived % (empty where no arrival rounded to it).
func WriteCSV(w io.Writer, results []*Result) error {
	cw := csv.NewWriter(w)
	cols := 0
	for _, r := range results {
		cols = max(cols, len(r.Curve))
	}
	header := []string{"workload", "sc_policy", "tune", "seed", "total_gpus"}
	for k := range cols {
		header = append(header, strconv.Itoa(k))
	}
	if err := cw.Write(header); err != nil {
		return err
	}
	for _, r := range results {
		row := []string{r.Workload, string(r.Policy), strconv.FormatFloat(r.Tune, 'f', -1, 64), strconv.FormatUint(r.Seed, 10), strconv.Itoa(r.GPUs)}
		for k := range cols {
			v := ""
			if k < len(r.Curve) && !math.IsNaN(r.Curve[k]) {
				v = strconv.FormatFloat(r.Curve[k], 'f', 2, 64)
			}
			row = append(row, v)
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// Summary is one policy's results averaged over seeds.
type Summary struct {
	Policy config.Policy
	Seeds  int
	// At100 and Final are allocation % at 100 % arrived demand and at the end.
	At100, Final float64
	// Unallocated is the number of GPUs left unallocated at 100 % arrived.
	Unallocated float64
	// Failed is the number of pods that fit nowhere, and Pods all arrivals.
	Failed, Pods float64
	// SharingFailedBy100 is the mean Result.SharingFailedBy100: where it is
	// 0 the policy is bound by the Ceiling.
	SharingFailedBy100 float64
	// Fragmentation is the mean Result.Fragmentation ratio at the end, in %.
	Fragmentation float64
}

// Summarize averages results per policy, in the order policies first appear.
func Summarize(results []*Result) []Summary {
	var out []Summary
	index := map[config.Policy]int{}
	for _, r := range results {
		i, ok := index[r.Policy]
		if !ok {
			i = len(out)
			index[r.Policy] = i
			out = append(out, Summary{Policy: r.Policy})
		}
		s := &out[i]
		s.Seeds++
		s.At100 += r.At100()
		s.Final += r.Final
		s.Unallocated += (1 - r.At100()/100) * float64(r.GPUs)
		s.Failed += float64(r.Failed)
		s.Pods += float64(r.Pods)
		s.SharingFailedBy100 += float64(r.SharingFailedBy100)
		s.Fragmentation += 100 * r.Fragmentation.Ratio()
	}
	for i := range out {
		s := &out[i]
		n := float64(s.Seeds)
		s.At100 /= n
		s.Final /= n
		s.Unallocated /= n
		s.Failed /= n
		s.Pods /= n
		s.SharingFailedBy100 /= n
		s.Fragmentation /= n
	}
	return out
}

// WriteSummary prints the summary table.
func WriteSummary(w io.Writer, workload string, gpus int, tune float64, sums []Summary) error {
	if _, err := fmt.Fprintf(w, "workload %s: %d GPUs, demand tuned to %.0f%% of capacity\n", workload, gpus, 100*tune); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tseeds\talloc@100%\talloc@end\tunallocated GPUs@100%\tfailed pods\tpods\tsharing failed@100%\tfragmentation@end\t")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%d\t%.2f%%\t%.2f%%\t%.1f\t%.1f\t%.0f\t%.1f\t%.1f%%\t\n", s.Policy, s.Seeds, s.At100, s.Final, s.Unallocated, s.Failed, s.Pods, s.SharingFailedBy100, s.Fragmentation)
	}
	return tw.Flush()
}

// WriteCeiling prints the mean Ceiling over seeds: the most any policy that
// places every sharing pod could allocate at 100 %.
func WriteCeiling(w io.Writer, gpus int, cs []Ceiling) error {
	if len(cs) == 0 {
		return nil
	}
	var at100, sharing, slicer, slivers float64
	for _, c := range cs {
		at100 += c.At100
		sharing += c.SharingGPUs
		slicer += float64(c.SlicerGPUs)
		slivers += c.SliverGPUs
	}
	n := float64(len(cs))
	at100, sharing, slicer, slivers = at100/n, sharing/n, slicer/n, slivers/n
	_, err := fmt.Fprintf(w, "ceiling @100%%: %.2f%% (%.1f GPUs unallocated at least) for a policy that places every sharing pod: "+
		"sharing pods' demand %.1f GPUs needs at least %.1f GPUs (bin-packing lower bound), leaving %.1f GPUs of slivers no whole-GPU pod can use\n",
		at100, float64(gpus)*(1-at100/100), sharing, slicer, slivers)
	return err
}

// WriteModelCeiling prints the mean ModelCeiling over seeds, beside the
// model-blind one: the most any placement of the arrivals could allocate
// at 100 %, with GPU models, node CPU and memory and multi-GPU pods, and
// how long the relaxations took. Seeds whose demand never reaches 100 %
// are left out; none left prints nothing.
func WriteModelCeiling(w io.Writer, gpus int, cs []ModelCeiling) error {
	var at100 float64
	var n, shapes, types int
	var took time.Duration
	for _, c := range cs {
		if math.IsNaN(c.At100) {
			continue
		}
		at100 += c.At100
		shapes, types = max(shapes, c.Shapes), max(types, c.NodeTypes)
		took += c.Took
		n++
	}
	if n == 0 {
		return nil
	}
	at100 /= float64(n)
	_, err := fmt.Fprintf(w, "ceiling @100%% with GPU models, CPU and memory: %.2f%% (%.1f GPUs unallocated at least) for any placement: "+
		"a linear relaxation over %d pod shapes and %d node types, solved in %v for %d seed(s)\n",
		at100, float64(gpus)*(1-at100/100), shapes, types, took.Round(time.Millisecond), n)
	return err
}
