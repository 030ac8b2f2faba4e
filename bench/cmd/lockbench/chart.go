package main

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The wait charts (-charts DIR) plot, per workload, each library's wait from
// the start of a lock call to its grant against the percentile: x on a scale
// that gives every "nine" (90, 99, 99.9, ...) the same width, y on a log
// scale. The points come from the grants that summarize already sorts for the
// table's p50/p99/max, taken at a fixed set of percentiles (waitQuantiles), so
// each series has at most a few hundred points however long the run.

// quantilePoint is one point of a wait distribution: the nearest-rank
// percentile P, in percent, and its wait.
type quantilePoint struct {
	P    float64
	Wait time.Duration
}

const (
	// maxNines is where the curves stop: 99.99%. Beyond it a 10 s run of the
	// hot workload (about 7,000 grants) has no samples.
	maxNines = 4
	// ninesStep is the spacing of the percentiles in nines: 50 points per
	// factor of ten in 1-p.
	ninesStep = 0.02
)

// tickPercentiles are the percentiles labelled on the x axis; waitQuantiles
// takes each of them too, so a curve passes exactly through the p50 and p99
// of the table.
var tickPercentiles = []float64{0, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99}

// nines is -log10(1-p/100) for a percentile p in percent: 0 for 0, 1 for 90,
// 2 for 99, 3 for 99.9.
func nines(p float64) float64 {
	if p >= 100 {
		return math.Inf(1)
	}
	return -math.Log10(1 - p/100)
}

// waitQuantiles returns the wait distribution of sorted (waits in
// nanoseconds, ascending) at fixed percentiles: every ninesStep nines from 0
// up to 1-1/n (the highest percentile that n samples resolve), capped at
// 99.99, plus the labelled tickPercentiles in that range, each the
// nearest-rank percentile as the table computes it. When the curve reaches
// 1-1/n, a last point there is the maximum. It returns nil for no samples.
func waitQuantiles(sorted []int64) []quantilePoint {
	n := len(sorted)
	if n == 0 {
		return nil
	}
	top := min(math.Log10(float64(n)), maxNines)
	var levels []float64
	for i := 0; float64(i)*ninesStep <= top+1e-9; i++ {
		levels = append(levels, 100*(1-math.Pow(10, -float64(i)*ninesStep)))
	}
	for _, p := range tickPercentiles {
		if nines(p) <= top+1e-9 {
			levels = append(levels, p)
		}
	}
	slices.Sort(levels)
	levels = slices.CompactFunc(levels, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })

	out := make([]quantilePoint, 0, len(levels)+1)
	for _, p := range levels {
		out = append(out, quantilePoint{P: p, Wait: percentile(sorted, p/100)})
	}
	last := out[len(out)-1]
	if top == math.Log10(float64(n)) && last.Wait != time.Duration(sorted[n-1]) {
		out = append(out, quantilePoint{P: last.P, Wait: time.Duration(sorted[n-1])})
	}
	return out
}

// chartSeries is one library's line in a wait chart.
type chartSeries struct {
	Lib      string
	Grants   int64
	Timeouts int64
	Points   []quantilePoint
}

// Library colours (Okabe-Ito, distinct also for the colour-blind) and
// dashes, the same in every chart; a library not listed gets a fallback.
var libStyles = map[string]struct {
	color  color.Color
	dashes []vg.Length
}{
	libReqlock:   {color.RGBA{R: 0x00, G: 0x72, B: 0xb2, A: 0xff}, nil},
	libRueidis:   {color.RGBA{R: 0xcc, G: 0x79, B: 0xa7, A: 0xff}, []vg.Length{vg.Points(8), vg.Points(2), vg.Points(2), vg.Points(2)}},
	libRedislock: {color.RGBA{R: 0xd5, G: 0x5e, B: 0x00, A: 0xff}, []vg.Length{vg.Points(6), vg.Points(3)}},
	libRedsync:   {color.RGBA{R: 0x00, G: 0x9e, B: 0x73, A: 0xff}, []vg.Length{vg.Points(2), vg.Points(2)}},
}

var fallbackColors = []color.Color{
	color.RGBA{R: 0xcc, G: 0x79, B: 0xa7, A: 0xff},
	color.RGBA{R: 0xe6, G: 0x9f, B: 0x00, A: 0xff},
	color.RGBA{R: 0x56, G: 0xb4, B: 0xe9, A: 0xff},
	color.Black,
}

func seriesStyle(lib string, i int) draw.LineStyle {
	s := draw.LineStyle{Color: fallbackColors[i%len(fallbackColors)], Width: vg.Points(1.6)}
	if ls, ok := libStyles[lib]; ok {
		s.Color, s.Dashes = ls.color, ls.dashes
	}
	return s
}

// Chart size, in points.
const (
	chartWidth  = 8 * vg.Inch
	chartHeight = 5 * vg.Inch
)

var (
	sansFont  = font.Font{Typeface: "Liberation", Variant: "Sans"}
	gridColor = color.Gray{Y: 0xdd}
)

// waitChart builds the chart of series, titled title (which may have
// several lines), and the legend that goes below it: one entry per series, in
// the order given, also for a series without points.
func waitChart(title string, series []chartSeries) (*plot.Plot, plot.Legend) {
	p := plot.New()
	for _, sty := range []*text.Style{&p.Title.TextStyle, &p.X.Label.TextStyle, &p.Y.Label.TextStyle,
		&p.X.Tick.Label, &p.Y.Tick.Label} {
		sty.Font = font.From(sansFont, sty.Font.Size)
	}
	p.Title.Text = title
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "percentile of granted lock calls (%), scale log(1/(1-p))"
	p.Y.Label.Text = "wait from lock call to grant (ms, log scale)"

	legend := plot.NewLegend()
	legend.TextStyle.Font = font.From(sansFont, 10)
	legend.Top, legend.Left = true, true
	legend.ThumbnailWidth = vg.Points(28)
	legend.Padding = vg.Points(2)

	grid := plotter.NewGrid()
	grid.Vertical.Color, grid.Horizontal.Color = gridColor, gridColor
	p.Add(grid)

	// Both axes are linear in transformed units, nines(p) and log10(ms), with
	// ticks labelled in percent and milliseconds: gonum's LogScale places a
	// centred axis label by the arithmetic midpoint of the range, which on a
	// log axis squeezes the plot.
	xmax, ymin, ymax := 0.0, math.Inf(1), math.Inf(-1)
	for i, s := range series {
		xys := make(plotter.XYs, len(s.Points))
		for j, q := range s.Points {
			// A wait of 0 (possible only with a clock that does not move)
			// cannot go on a log scale: 1 ns is below any real wait.
			y := math.Log10(float64(max(q.Wait, 1)) / float64(time.Millisecond))
			xys[j] = plotter.XY{X: nines(q.P), Y: y}
			xmax, ymin, ymax = max(xmax, xys[j].X), min(ymin, y), max(ymax, y)
		}
		line := &plotter.Line{XYs: xys, LineStyle: seriesStyle(s.Lib, i)}
		thumbs := []plot.Thumbnailer{line}
		switch len(xys) {
		case 0:
		case 1:
			// One point draws no line: mark it.
			sc := &plotter.Scatter{XYs: xys, GlyphStyle: draw.GlyphStyle{
				Color: line.Color, Radius: vg.Points(3), Shape: draw.CircleGlyph{}}}
			p.Add(sc)
			thumbs = append(thumbs, sc)
		default:
			p.Add(line)
		}
		legend.Add(legendText(s), thumbs...)
	}

	// x: from 0 to the last percentile of any curve, at least 90.
	p.X.Min, p.X.Max = 0, max(xmax, 1)
	p.X.Tick.Marker = percentileTicks{}
	// y: from the 1, 2 or 5 times a power of ten at or below the lowest
	// point to the one at or above the highest; 0.1 to 1000 ms when there is
	// no point.
	if math.IsInf(ymin, 1) {
		ymin, ymax = -1, 3
	}
	p.Y.Min, p.Y.Max = roundLog125(ymin, false), roundLog125(ymax, true)
	if p.Y.Max <= p.Y.Min+1e-9 {
		p.Y.Max = roundLog125(p.Y.Min+0.1, true)
	}
	p.Y.Tick.Marker = msLogTicks{}
	return p, legend
}

func legendText(s chartSeries) string {
	t := fmt.Sprintf("%s: %s", s.Lib, plural(s.Grants, "grant"))
	if s.Timeouts > 0 {
		t += fmt.Sprintf(", %s (not in the curve)", plural(s.Timeouts, "timeout"))
	}
	if len(s.Points) == 0 {
		t += ", no wait to plot"
	}
	return t
}

func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// renderSVG draws the chart of series as an SVG document.
func renderSVG(title string, series []chartSeries) ([]byte, error) {
	p, legend := waitChart(title, series)
	c := vgsvg.New(chartWidth, chartHeight)
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	p.BackgroundColor = nil

	// The legend gets its own strip below the plot, so that it never covers
	// a line.
	pad := vg.Points(6)
	entryH := legend.TextStyle.Rectangle("Xg").Size().Y
	legendH := vg.Length(len(series))*(entryH+legend.Padding) + 2*pad
	area := draw.Crop(dc, pad, -pad, pad+legendH, -pad)
	p.Draw(area)
	strip := dc
	strip.Min.X = p.DataCanvas(area).Min.X // under the data, past the y axis
	strip.Max.Y = dc.Min.Y + legendH
	strip.Min.Y = dc.Min.Y + pad
	legend.Draw(strip)

	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	// The fonts are not embedded (that would add hundreds of kilobytes): name
	// fallbacks with the same metrics (Arial, Helvetica) for viewers without
	// Liberation Sans.
	return bytes.ReplaceAll(buf.Bytes(), []byte("font-family:Liberation Sans;"),
		[]byte("font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")), nil
}

// chartSeriesOf returns the series of results, in their order.
func chartSeriesOf(results []*libResult) []chartSeries {
	out := make([]chartSeries, len(results))
	for i, r := range results {
		out[i] = chartSeries{Lib: r.Lib, Grants: r.Acquisitions, Timeouts: r.Timeouts, Points: r.WaitCurve}
	}
	return out
}

// chartTitle names the workload, its parameters and the run's.
func chartTitle(cfg config, workload string) string {
	var params string
	switch workload {
	case "hot":
		params = fmt.Sprintf("1 key, %d goroutines in 1 process, hold %v", cfg.Waiters, cfg.Hold)
	case "spread":
		params = fmt.Sprintf("%d keys, %d workers, no hold", cfg.Keys, cfg.Workers)
		if cfg.Keys%cfg.Workers == 0 {
			params += ", no key shared"
		}
	case "multi":
		params = fmt.Sprintf("1 key, %d processes, %d goroutines in total, hold %v", cfg.Procs, cfg.Waiters, cfg.Hold)
	}
	return fmt.Sprintf("%s workload: wait until grant, by library\n%s; %v per library, wait limit %v",
		workload, params, cfg.Duration, cfg.Wait)
}

// writeWaitChart writes the wait chart of one workload's results to
// dir/wait-<workload>.svg, creating dir, and returns the path.
func writeWaitChart(dir string, cfg config, workload string, results []*libResult) (string, error) {
	b, err := renderSVG(chartTitle(cfg, workload), chartSeriesOf(results))
	if err != nil {
		return "", fmt.Errorf("chart of %s: %w", workload, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "wait-"+workload+".svg")
	return path, os.WriteFile(path, b, 0o644)
}

// percentileTicks labels tickPercentiles on an axis of nines.
type percentileTicks struct{}

func (percentileTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for _, p := range tickPercentiles {
		if x := nines(p); x >= lo-1e-9 && x <= hi+1e-9 {
			ticks = append(ticks, plot.Tick{Value: x, Label: strconv.FormatFloat(p, 'f', -1, 64)})
		}
	}
	return ticks
}

// roundLog125 rounds y, a log10, down (or up) to the log10 of the nearest
// 1, 2 or 5 times a power of ten.
func roundLog125(y float64, up bool) float64 {
	e := math.Floor(y)
	steps := []float64{e, e + math.Log10(2), e + math.Log10(5), e + 1}
	if up {
		for _, v := range steps {
			if v >= y-1e-9 {
				return v
			}
		}
	}
	for _, v := range slices.Backward(steps) {
		if v <= y+1e-9 {
			return v
		}
	}
	return e
}

// msLogTicks marks an axis of log10(ms) at 1 to 9 times each power of ten of
// milliseconds, labelling the powers of ten (0.01, 0.1, 1, 10, ...), the
// ends of the axis, and 2 and 5 times the powers of ten when the axis spans at
// most two of them.
type msLogTicks struct{}

func (msLogTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	few := hi-lo <= 2+1e-9
	for e := math.Floor(lo); e <= math.Ceil(hi); e++ {
		for m := 1; m <= 9; m++ {
			y := e + math.Log10(float64(m))
			if y < lo-1e-9 || y > hi+1e-9 {
				continue
			}
			t := plot.Tick{Value: y}
			end := math.Abs(y-lo) < 1e-9 || math.Abs(y-hi) < 1e-9
			if m == 1 || end || few && (m == 2 || m == 5) {
				t.Label = strconv.FormatFloat(float64(m)*math.Pow(10, e), 'f', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}
