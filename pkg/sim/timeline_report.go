package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

// TimelineSummary is one policy's timeline results averaged over seeds.
type TimelineSummary struct {
	Policy                       config.Policy
	Seeds                        int
	MeanAllocation, P5Allocation float64
	DelayP50, DelayP99           float64
	Queued, NeverPlaced          float64
	Fragmentation                float64
}

// SummarizeTimelines averages each policy's results over its seeds, in
// the order the policies first appear.
func SummarizeTimelines(results []*TimelineResult) []TimelineSummary {
	var out []TimelineSummary
	index := map[config.Policy]int{}
	for _, r := range results {
		i, ok := index[r.Policy]
		if !ok {
			i = len(out)
			index[r.Policy] = i
			out = append(out, TimelineSummary{Policy: r.Policy})
		}
		s := &out[i]
		s.Seeds++
		s.MeanAllocation += r.MeanAllocation
		s.P5Allocation += r.P5Allocation
		s.DelayP50 += r.DelayP50
		s.DelayP99 += r.DelayP99
		s.Queued += float64(r.Queued)
		s.NeverPlaced += float64(r.NeverPlaced)
		s.Fragmentation += r.Fragmentation
	}
	for i := range out {
		s := &out[i]
		n := float64(s.Seeds)
		s.MeanAllocation /= n
		s.P5Allocation /= n
		s.DelayP50 /= n
		s.DelayP99 /= n
		s.Queued /= n
		s.NeverPlaced /= n
		s.Fragmentation /= n
	}
	return out
}

// WriteTimelineSummary prints one row per policy.
func WriteTimelineSummary(w io.Writer, workload string, gpus, pods int, speedup float64, sums []TimelineSummary) error {
	if _, err := fmt.Fprintf(w, "workload %s by time: %d GPUs, %d pods, arrivals %gx as fast as the trace's; allocation and fragmentation over the arrival window\n",
		workload, gpus, pods, speedup); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tseeds\talloc mean\talloc p5\tdelay p50\tdelay p99\tqueued pods\tnever placed\tfragmentation\t")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%d\t%.2f%%\t%.2f%%\t%s\t%s\t%.1f\t%.1f\t%.1f%%\t\n", s.Policy, s.Seeds, s.MeanAllocation, s.P5Allocation,
			seconds(s.DelayP50), seconds(s.DelayP99), s.Queued, s.NeverPlaced, s.Fragmentation)
	}
	return tw.Flush()
}

// seconds writes a delay the way a person reads it.
func seconds(s float64) string {
	switch {
	case s < 60:
		return fmt.Sprintf("%.0fs", s)
	case s < 3600:
		return fmt.Sprintf("%.1fm", s/60)
	default:
		return fmt.Sprintf("%.1fh", s/3600)
	}
}

// WriteTimelineCSV writes the curves, one row per sample:
// workload,sc_policy,seed,time_s,allocation,queue.
func WriteTimelineCSV(w io.Writer, results []*TimelineResult) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"workload", "sc_policy", "seed", "time_s", "allocation", "queue"}); err != nil {
		return err
	}
	for _, r := range results {
		for k := range r.Times {
			if err := cw.Write([]string{r.Workload, string(r.Policy), strconv.FormatUint(r.Seed, 10),
				strconv.FormatFloat(r.Times[k], 'f', 0, 64), strconv.FormatFloat(r.Allocation[k], 'f', 2, 64), strconv.Itoa(r.Queue[k])}); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// SaveTimelinePlot draws, on one picture, GPU allocation over time (top)
// and the pods waiting (bottom), one line per policy (mean over seeds,
// time in hours from the first arrival), and saves it as PNG.
func SaveTimelinePlot(path, workload string, results []*TimelineResult) error {
	alloc, queue := plot.New(), plot.New()
	alloc.Title.Text = fmt.Sprintf("GPU allocation over time, workload %s", workload)
	alloc.Y.Label.Text = "GPUs allocated (% of capacity)"
	queue.X.Label.Text = "hours since the first arrival"
	queue.Y.Label.Text = "pods waiting"
	alloc.Legend.Top, alloc.Legend.Left = true, true

	var order []config.Policy
	sumA := map[config.Policy][]float64{}
	sumQ := map[config.Policy][]float64{}
	n := map[config.Policy]int{}
	var times []float64
	for _, r := range results {
		if _, ok := sumA[r.Policy]; !ok {
			order = append(order, r.Policy)
			sumA[r.Policy] = make([]float64, len(r.Times))
			sumQ[r.Policy] = make([]float64, len(r.Times))
		}
		if len(r.Times) > len(times) {
			times = r.Times
		}
		for k := range r.Times {
			if k < len(sumA[r.Policy]) {
				sumA[r.Policy][k] += r.Allocation[k]
				sumQ[r.Policy][k] += float64(r.Queue[k])
			}
		}
		n[r.Policy]++
	}
	for i, pol := range order {
		var a, q plotter.XYs
		for k := range sumA[pol] {
			h := (times[k] - times[0]) / 3600
			a = append(a, plotter.XY{X: h, Y: sumA[pol][k] / float64(n[pol])})
			q = append(q, plotter.XY{X: h, Y: sumQ[pol][k] / float64(n[pol])})
		}
		for _, c := range []struct {
			p   *plot.Plot
			pts plotter.XYs
		}{{alloc, a}, {queue, q}} {
			line, err := plotter.NewLine(c.pts)
			if err != nil {
				return fmt.Errorf("plotting %s: %w", pol, err)
			}
			line.Color = palette[i%len(palette)]
			line.Width = vg.Points(1.5)
			c.p.Add(line)
			if c.p == alloc {
				alloc.Legend.Add(string(pol), line)
			}
		}
	}
	alloc.Y.Min, queue.Y.Min = 0, 0
	img := vgimg.New(8*vg.Inch, 7*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(8), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align([][]*plot.Plot{{alloc}, {queue}}, tiles, dc)
	alloc.Draw(canvases[0][0])
	queue.Draw(canvases[1][0])
	return savePNG(path, img)
}

// savePNG writes a drawn canvas to path as PNG.
func savePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("saving plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("saving plot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("saving plot: %w", err)
	}
	return nil
}
