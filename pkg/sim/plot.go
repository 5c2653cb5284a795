package sim

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// SavePlot draws allocation against arrived demand, one line per policy
// (mean over seeds), with the ideal y = x up to 100 %, and saves it as PNG.
func SavePlot(path, workload string, results []*Result) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("GPU allocation, workload %s", workload)
	p.X.Label.Text = "arrived GPU demand (% of capacity)"
	p.Y.Label.Text = "GPUs allocated (% of capacity)"
	p.Legend.Top = true
	p.Legend.Left = true

	ideal := plotter.NewFunction(func(x float64) float64 { return math.Min(x, 100) })
	ideal.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	ideal.Color = color.Gray{Y: 0x90}
	p.Add(ideal)
	p.Legend.Add("ideal", ideal)

	var order []config.Policy
	curves := map[config.Policy][]float64{}
	counts := map[config.Policy][]int{}
	for _, r := range results {
		if _, ok := curves[r.Policy]; !ok {
			order = append(order, r.Policy)
			curves[r.Policy] = make([]float64, len(r.Curve))
			counts[r.Policy] = make([]int, len(r.Curve))
		}
		for k, v := range r.Curve {
			if k < len(curves[r.Policy]) && !math.IsNaN(v) {
				curves[r.Policy][k] += v
				counts[r.Policy][k]++
			}
		}
	}
	for i, pol := range order {
		var pts plotter.XYs
		for k, sum := range curves[pol] {
			if counts[pol][k] > 0 {
				pts = append(pts, plotter.XY{X: float64(k), Y: sum / float64(counts[pol][k])})
			}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plotting %s: %w", pol, err)
		}
		line.Color = palette[i%len(palette)]
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(string(pol), line)
	}
	p.X.Min, p.Y.Min = 0, 0
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("saving plot: %w", err)
	}
	return nil
}
