package main

import (
	"fmt"
	"image/color"
	"os"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var systemColors = map[string]color.RGBA{
	"leaderfeed/memory":   {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"leaderfeed/postgres": {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	"leaderfeed/mongo":    {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	"leaderfeed/rethink":  {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	"etcd":                {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
}

// ecdf returns at most 400 points of the empirical distribution of s, in
// milliseconds (at least 0.01, for the log scale).
func ecdf(s []time.Duration) plotter.XYs {
	s = slices.Clone(s)
	slices.Sort(s)
	n := len(s)
	step := max(1, n/400)
	var xy plotter.XYs
	for i := 0; i < n; i += step {
		xy = append(xy, plotter.XY{X: max(0.01, float64(s[i])/float64(time.Millisecond)), Y: float64(i+1) / float64(n)})
	}
	last := plotter.XY{X: max(0.01, float64(s[n-1])/float64(time.Millisecond)), Y: 1}
	if xy[len(xy)-1] != last {
		xy = append(xy, last)
	}
	return xy
}

// plotLatency draws, for each scenario, the distribution (ECDF, log time
// axis) of every system's samples, in one PNG.
func plotLatency(path string, all []series) error {
	panels := [][]string{{"handover", "observer", "crash"}, {"fanout-10", "fanout-100", "fanout-1000"}}
	// Drawn in the same panel, dashed or dotted, with a label suffix.
	extra := map[string]map[string]struct {
		dashes []vg.Length
		label  string
	}{"crash": {
		"crash-strict":  {[]vg.Length{vg.Points(4), vg.Points(3)}, " (timeout fixed at bound)"},
		"crash-derived": {[]vg.Length{vg.Points(1), vg.Points(2)}, " (TimingFor(bound))"},
	}}
	plots := make([][]*plot.Plot, len(panels))
	for row, keys := range panels {
		for _, key := range keys {
			p := plot.New()
			p.Title.Text = scenarioTitle(key)
			p.Title.TextStyle.Font.Size = vg.Points(10)
			p.X.Label.Text = "ms (log scale)"
			p.Y.Label.Text = "fraction of samples ≤ x"
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = plot.LogTicks{Prec: -1}
			p.Y.Min, p.Y.Max = 0, 1
			p.Add(plotter.NewGrid())
			p.Legend.Top, p.Legend.Left = false, false
			p.Legend.TextStyle.Font.Size = vg.Points(8)
			drawn := false
			for _, s := range all {
				x, isExtra := extra[key][s.scenario]
				if len(s.samples) == 0 || (s.scenario != key && !isExtra) {
					continue
				}
				l, err := plotter.NewLine(ecdf(s.samples))
				if err != nil {
					return err
				}
				l.Color = systemColors[s.system]
				l.Width = vg.Points(1.5)
				label := s.system
				if isExtra {
					l.Dashes = x.dashes
					label += x.label
				}
				p.Add(l)
				p.Legend.Add(fmt.Sprintf("%s n=%d", strings.TrimPrefix(label, "leaderfeed/"), len(s.samples)), l)
				drawn = true
			}
			if key == "crash" && drawn { // 0.2–1.5 s: a linear axis reads better
				p.Legend.Top, p.Legend.Left = true, true
				p.X.Scale = plot.LinearScale{}
				p.X.Tick.Marker = plot.DefaultTicks{}
				p.X.Label.Text = "ms"
			}
			if !drawn {
				p.Title.Text += " (no data)"
				p.X.Scale = plot.LinearScale{}
				p.X.Tick.Marker = plot.DefaultTicks{}
			}
			plots[row] = append(plots[row], p)
		}
	}
	w, h := 15*vg.Inch, 8.5*vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: len(panels[0]), PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 4, PadBottom: vg.Millimeter * 4, PadLeft: vg.Millimeter * 4, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(plots, tiles, dc)
	for r := range plots {
		for c := range plots[r] {
			plots[r][c].Draw(canvases[r][c])
		}
	}
	return writePNG(path, img)
}

func writePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
