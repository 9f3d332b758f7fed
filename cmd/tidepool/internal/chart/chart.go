// Package chart draws the PNG plots of tidepool bench and replay.
package chart

import (
	"fmt"
	"image/color"
	"math"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/tidepool-kv/tidepool/internal/bench"
)

// palette is a colour-blind-safe set (Okabe–Ito).
var palette = []color.Color{
	color.RGBA{0, 114, 178, 255},   // blue
	color.RGBA{213, 94, 0, 255},    // vermillion
	color.RGBA{0, 158, 115, 255},   // green
	color.RGBA{204, 121, 167, 255}, // purple
	color.RGBA{230, 159, 0, 255},   // orange
	color.RGBA{86, 180, 233, 255},  // sky
	color.RGBA{0, 0, 0, 255},       // black
}

// series is one line of a plot.
type series struct {
	name   string
	xy     plotter.XYs
	dashed bool
	// colorKey: series with the same key share a colour (default: name).
	colorKey string
}

// savePlot draws series as lines with points and writes a PNG.
func savePlot(path, title, xlabel, ylabel string, logX, logY bool, ss []series) error {
	return savePlotY(path, title, xlabel, ylabel, logX, logY, math.NaN(), ss)
}

// dataTicks labels exactly the x values present in ss (readable on a log
// axis, where the default ticks may show only powers of ten).
func dataTicks(ss []series) plot.ConstantTicks {
	seen := map[float64]bool{}
	var xs []float64
	for _, s := range ss {
		for _, p := range s.xy {
			if !seen[p.X] {
				seen[p.X] = true
				xs = append(xs, p.X)
			}
		}
	}
	sort.Float64s(xs)
	var t plot.ConstantTicks
	for _, x := range xs {
		t = append(t, plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'g', 4, 64)})
	}
	return t
}

// savePlotY is savePlot with the y axis from 0 to yMax (NaN: automatic,
// with headroom for the legend).
func savePlotY(path, title, xlabel, ylabel string, logX, logY bool, yMax float64, ss []series) error {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	if logX {
		p.X.Scale = plot.LogScale{}
	}
	p.X.Tick.Marker = dataTicks(ss)
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = microTicks{}
	}
	colors := map[string]color.Color{}
	for _, s := range ss {
		if len(s.xy) == 0 {
			continue
		}
		key := s.colorKey
		if key == "" {
			key = s.name
		}
		c, ok := colors[key]
		if !ok {
			c = palette[len(colors)%len(palette)]
			colors[key] = c
		}
		l, pts, err := plotter.NewLinePoints(s.xy)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.name, err)
		}
		l.Color, pts.Color = c, c
		l.Width = vg.Points(1.8)
		pts.Shape = draw.CircleGlyph{}
		pts.Radius = vg.Points(3)
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l, pts)
		p.Legend.Add(s.name, l, pts)
	}
	if !logY {
		top := 0.0
		for _, s := range ss {
			for _, pt := range s.xy {
				top = math.Max(top, pt.Y)
			}
		}
		p.Y.Min = 0
		p.Y.Max = top * 1.35 // room for the legend above the lines
		if !math.IsNaN(yMax) {
			p.Y.Max = yMax
		}
	} else {
		p.Y.Max *= 4 // room for the legend above the lines
	}
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

// Latency draws latency percentiles against concurrency, one line per
// percentile, from a concurrency sweep of one operation.
func Latency(path string, reps []bench.Report) error {
	if len(reps) == 0 {
		return fmt.Errorf("plot: no runs")
	}
	reps = append([]bench.Report(nil), reps...)
	sort.Slice(reps, func(i, j int) bool { return reps[i].Concurrency < reps[j].Concurrency })
	pcts := []struct {
		name string
		get  func(bench.Report) float64
	}{
		{"p50", func(r bench.Report) float64 { return r.P50Us }},
		{"p90", func(r bench.Report) float64 { return r.P90Us }},
		{"p99", func(r bench.Report) float64 { return r.P99Us }},
		{"p99.9", func(r bench.Report) float64 { return r.P999Us }},
	}
	var ss []series
	for _, pc := range pcts {
		s := series{name: pc.name}
		for _, r := range reps {
			s.xy = append(s.xy, plotter.XY{X: float64(r.Concurrency), Y: math.Max(pc.get(r), 0.1)})
		}
		ss = append(ss, s)
	}
	r0 := reps[0]
	title := fmt.Sprintf("tidepool bench: %s of %s values", r0.Op, bench.FormatSize(int64(r0.Size)))
	if r0.Mode != "" {
		title += " (" + r0.Mode + ")"
	}
	title += " — latency percentiles vs concurrency"
	logX := reps[len(reps)-1].Concurrency >= 4*reps[0].Concurrency
	return savePlot(path, title, "concurrent callers", "latency (log scale)", logX, true, ss)
}

// HitPoint is one replay result for the hit-rate plot.
type HitPoint struct {
	Policy         string  `json:"policy"`
	CapacityTokens int64   `json:"capacity_tokens"`
	CapacityBlocks int64   `json:"capacity_blocks"`
	HitRate        float64 `json:"hit_rate"`
	Simulated      bool    `json:"simulated"`
}

// HitRate draws hit rate against per-node capacity, one line per
// policy (dashed for references such as the offline optimum).
func HitRate(path, title string, pts []HitPoint, dashed map[string]bool) error {
	if len(pts) == 0 {
		return fmt.Errorf("plot: no points")
	}
	var order []string
	by := map[string][]HitPoint{}
	for _, p := range pts {
		if _, ok := by[p.Policy]; !ok {
			order = append(order, p.Policy)
		}
		by[p.Policy] = append(by[p.Policy], p)
	}
	var ss []series
	minX, maxX := math.Inf(1), math.Inf(-1)
	for _, name := range order {
		ps := by[name]
		sort.Slice(ps, func(i, j int) bool { return ps[i].CapacityTokens < ps[j].CapacityTokens })
		key, _, _ := strings.Cut(name, " (")
		if dashed[name] && key == name {
			key = ""
		}
		s := series{name: name, dashed: dashed[name], colorKey: key}
		for _, p := range ps {
			x := float64(p.CapacityTokens) / 1e6
			minX, maxX = math.Min(minX, x), math.Max(maxX, x)
			s.xy = append(s.xy, plotter.XY{X: x, Y: p.HitRate})
		}
		ss = append(ss, s)
	}
	return savePlot(path, title, "capacity per node (million tokens, log scale)", "prefix hit rate", maxX >= 4*minX, false, ss)
}

// microTicks are log ticks for a latency axis in microseconds, labelled
// "10 µs", "1 ms", "1 s".
type microTicks struct{}

func (microTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.LogTicks{Prec: -1}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label == "" {
			continue
		}
		v := ts[i].Value
		switch {
		case v >= 1e6:
			ts[i].Label = strconv.FormatFloat(v/1e6, 'g', 3, 64) + " s"
		case v >= 1e3:
			ts[i].Label = strconv.FormatFloat(v/1e3, 'g', 3, 64) + " ms"
		default:
			ts[i].Label = strconv.FormatFloat(v, 'g', 3, 64) + " µs"
		}
	}
	return ts
}
