package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNines(t *testing.T) {
	for _, tc := range []struct{ p, want float64 }{
		{0, 0}, {50, math.Log10(2)}, {90, 1}, {99, 2}, {99.9, 3}, {99.99, 4},
	} {
		if got := nines(tc.p); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("nines(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := nines(100); !math.IsInf(got, 1) {
		t.Errorf("nines(100) = %v, want +Inf", got)
	}
}

// at returns the wait of the first point of q at percentile p, and whether
// there is one.
func at(q []quantilePoint, p float64) (time.Duration, bool) {
	for _, x := range q {
		if math.Abs(x.P-p) < 1e-9 {
			return x.Wait, true
		}
	}
	return 0, false
}

func TestWaitQuantiles(t *testing.T) {
	// Ten waits 10, 20, ..., 100 ns. Nearest rank: the p-th percentile is the
	// ceil(p/100*10)-th smallest.
	var ten []int64
	for i := 1; i <= 10; i++ {
		ten = append(ten, int64(10*i))
	}
	q := waitQuantiles(ten)
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{
		{0, 10},  // rank clamped to 1: the minimum
		{50, 50}, // ceil(5) = 5th
		{75, 80}, // ceil(7.5) = 8th
		{90, 90}, // ceil(9) = 9th; 90 = 1-1/10 is as far as 10 samples go
	} {
		if got, ok := at(q, tc.p); !ok || got != tc.want {
			t.Errorf("10 samples: p%v = %v (present %v), want %v", tc.p, got, ok, tc.want)
		}
	}
	// Then the maximum, at the same last percentile.
	if last := q[len(q)-1]; math.Abs(last.P-90) > 1e-9 || last.Wait != 100 {
		t.Errorf("10 samples: last point %+v, want the max 100 at 90", last)
	}
	// 51 levels from 0 to 1 nine in steps of 0.02 (0 and 90 among them),
	// plus 50 and 75, plus the maximum.
	if len(q) != 51+2+1 {
		t.Errorf("10 samples: %d points, want 54", len(q))
	}
	for i := 1; i < len(q); i++ {
		if q[i].P < q[i-1].P || q[i].Wait < q[i-1].Wait {
			t.Fatalf("points %d and %d out of order: %+v, %+v", i-1, i, q[i-1], q[i])
		}
	}

	// Four waits: up to 1-1/4 = 75.
	q = waitQuantiles([]int64{1, 2, 3, 4})
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {50, 2}, {75, 3}} {
		if got, ok := at(q, tc.p); !ok || got != tc.want {
			t.Errorf("4 samples: p%v = %v (present %v), want %v", tc.p, got, ok, tc.want)
		}
	}
	if last := q[len(q)-1]; math.Abs(last.P-75) > 1e-9 || last.Wait != 4 {
		t.Errorf("4 samples: last point %+v, want the max 4 at 75", last)
	}
	if _, ok := at(q, 90); ok {
		t.Error("4 samples: a point at 90, beyond what 4 samples resolve")
	}

	// One wait: one point. None: no point.
	if q := waitQuantiles([]int64{7}); !slices.Equal(q, []quantilePoint{{0, 7}}) {
		t.Errorf("1 sample: %+v, want [{0 7}]", q)
	}
	if q := waitQuantiles(nil); q != nil {
		t.Errorf("no sample: %+v, want nil", q)
	}

	// 100,000 waits 1..100000: the curve stops at 99.99 without the max, and
	// its size stays bounded.
	big := make([]int64, 100_000)
	for i := range big {
		big[i] = int64(i + 1)
	}
	q = waitQuantiles(big)
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50_000}, {99, 99_000}, {99.9, 99_900}, {99.99, 99_990}} {
		if got, ok := at(q, tc.p); !ok || got != tc.want {
			t.Errorf("100000 samples: p%v = %v (present %v), want %v", tc.p, got, ok, tc.want)
		}
	}
	if last := q[len(q)-1]; math.Abs(last.P-99.99) > 1e-9 || last.Wait != 99_990 {
		t.Errorf("100000 samples: last point %+v, want p99.99 = 99990", last)
	}
	if max := int(maxNines/ninesStep) + 1 + len(tickPercentiles) + 1; len(q) > max {
		t.Errorf("100000 samples: %d points, want at most %d", len(q), max)
	}
}

// svgDoc is what the tests read of an SVG document.
type svgDoc struct {
	texts []string
	paths []svgPath
}

type svgPath struct{ d, style string }

// parseSVG parses b as XML, checks that its root is <svg>, and collects the
// text of every <text> and every <path>.
func parseSVG(t *testing.T, b []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	dec := xml.NewDecoder(bytes.NewReader(b))
	var inText bool
	var text strings.Builder
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not valid XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			switch el.Name.Local {
			case "text":
				inText = true
				text.Reset()
			case "path":
				var p svgPath
				for _, a := range el.Attr {
					switch a.Name.Local {
					case "d":
						p.d = a.Value
					case "style":
						p.style = a.Value
					}
				}
				doc.paths = append(doc.paths, p)
			}
		case xml.CharData:
			if inText {
				text.Write(el)
			}
		case xml.EndElement:
			if el.Name.Local == "text" {
				inText = false
				doc.texts = append(doc.texts, text.String())
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return doc
}

// strokePaths returns the paths drawn with colour hex (such as "#0072B2"),
// and how many segments each has.
func (d svgDoc) strokePaths(hex string) []int {
	var segs []int
	for _, p := range d.paths {
		if strings.Contains(strings.ToUpper(p.style), "STROKE:"+strings.ToUpper(hex)+";") {
			segs = append(segs, strings.Count(p.d, "L"))
		}
	}
	return segs
}

func (d svgDoc) hasText(s string) bool { return slices.Contains(d.texts, s) }

func TestRenderSVG(t *testing.T) {
	curve := func(scale int64) []quantilePoint {
		w := make([]int64, 2000)
		for i := range w {
			w[i] = scale * int64(i+1) * int64(100*time.Microsecond)
		}
		return waitQuantiles(w)
	}
	series := []chartSeries{
		{Lib: libReqlock, Grants: 2000, Points: curve(1)},
		{Lib: libRedislock, Grants: 2000, Timeouts: 7, Points: curve(3)},
		{Lib: libRedsync, Grants: 2000, Points: curve(9)},
	}
	cfg := config{Waiters: 50, Hold: time.Millisecond, Duration: 3 * time.Second, Wait: 5 * time.Second}
	b, err := renderSVG(chartTitle(cfg, "hot"), series)
	if err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b)

	for _, want := range []string{
		"hot workload: wait until grant, by library",
		"1 key, 50 goroutines in 1 process, hold 1ms; 3s per library, wait limit 5s",
		"percentile of granted lock calls (%), scale log(1/(1-p))",
		"wait from lock call to grant (ms, log scale)",
		"reqlock: 2000 grants",
		"redislock: 2000 grants, 7 timeouts (not in the curve)",
		"redsync: 2000 grants",
		// x ticks up to 99.9 (2000 samples reach 99.95), y ticks in ms
		// (0.1 to 1800 ms: the axis ends at 2000)
		"0", "50", "90", "99", "99.9", "0.1", "1", "10", "100", "1000", "2000",
	} {
		if !doc.hasText(want) {
			t.Errorf("no text %q in the SVG; texts: %q", want, doc.texts)
		}
	}
	if doc.hasText("99.99") {
		t.Error("x axis reaches 99.99, beyond the data")
	}
	// One data line per library (one segment fewer than its points), and its
	// legend sample (one segment), each in the library's own colour.
	for _, s := range series {
		hex := colorHex(seriesStyle(s.Lib, 0).Color)
		segs := doc.strokePaths(hex)
		slices.Sort(segs)
		if want := []int{1, len(s.Points) - 1}; !slices.Equal(segs, want) {
			t.Errorf("%s: paths in %s with %v segments, want %v (legend, line)", s.Lib, hex, segs, want)
		}
	}
	if len(b) > 100_000 {
		t.Errorf("SVG of %d bytes, want it small", len(b))
	}
}

func TestRenderSVGEmptyAndSingle(t *testing.T) {
	cfg := config{Keys: 1000, Workers: 50, Duration: time.Second, Wait: 5 * time.Second}
	for name, series := range map[string][]chartSeries{
		"no series":  nil,
		"all empty":  {{Lib: libReqlock, Timeouts: 3}, {Lib: libRedsync}},
		"one sample": {{Lib: libReqlock, Grants: 1, Timeouts: 1, Points: waitQuantiles([]int64{int64(time.Millisecond)})}},
		"mixed": {
			{Lib: libReqlock, Grants: 1, Points: waitQuantiles([]int64{int64(3 * time.Millisecond)})},
			{Lib: libRedislock, Timeouts: 50},
			{Lib: libRedsync, Grants: 2, Points: waitQuantiles([]int64{0, 5})}, // a 0 wait clamps to 1ns
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := renderSVG(chartTitle(cfg, "spread"), series)
			if err != nil {
				t.Fatal(err)
			}
			doc := parseSVG(t, b)
			if !doc.hasText("spread workload: wait until grant, by library") {
				t.Errorf("no title; texts: %q", doc.texts)
			}
			if want := "reqlock: 1 grant, 1 timeout (not in the curve)"; name == "one sample" && !doc.hasText(want) {
				t.Errorf("no legend entry %q; texts: %q", want, doc.texts)
			}
			for _, s := range series {
				if !doc.hasText(legendText(s)) {
					t.Errorf("no legend entry %q; texts: %q", legendText(s), doc.texts)
				}
			}
		})
	}
}

func TestWriteWaitChart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "charts", "nested")
	cfg := config{Procs: 4, Waiters: 50, Hold: time.Millisecond, Duration: time.Second, Wait: 5 * time.Second}
	results := []*libResult{
		{Lib: libReqlock, Acquisitions: 3, WaitCurve: waitQuantiles([]int64{1e5, 2e5, 9e6})},
		{Lib: libRedsync, Acquisitions: 0, Timeouts: 4},
	}
	path, err := writeWaitChart(dir, cfg, "multi", results)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "wait-multi.svg"); path != want {
		t.Errorf("path %q, want %q", path, want)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b)
	if want := "1 key, 4 processes, 50 goroutines in total, hold 1ms; 1s per library, wait limit 5s"; !doc.hasText(want) {
		t.Errorf("no subtitle %q; texts: %q", want, doc.texts)
	}
	if !doc.hasText("redsync: 0 grants, 4 timeouts (not in the curve), no wait to plot") || !doc.hasText("reqlock: 3 grants") {
		t.Errorf("no legend entry for the library without grants; texts: %q", doc.texts)
	}
}

func TestMsLogTicks(t *testing.T) {
	labels := func(lo, hi float64) []string {
		var out []string
		for _, tk := range (msLogTicks{}).Ticks(lo, hi) {
			if tk.Label != "" {
				out = append(out, tk.Label)
			}
		}
		return out
	}
	if got, want := labels(-2, 1), []string{"0.01", "0.1", "1", "10"}; !slices.Equal(got, want) {
		t.Errorf("ticks of 0.01..10 ms: %q, want %q", got, want)
	}
	if got, want := labels(-1, 1), []string{"0.1", "0.2", "0.5", "1", "2", "5", "10"}; !slices.Equal(got, want) {
		t.Errorf("ticks of 0.1..10 ms: %q, want %q", got, want)
	}
	// Ends at 2 and 5 times a power of ten are labelled.
	if got, want := labels(math.Log10(0.02), math.Log10(5000)), []string{"0.02", "0.1", "1", "10", "100", "1000", "5000"}; !slices.Equal(got, want) {
		t.Errorf("ticks of 0.02..5000 ms: %q, want %q", got, want)
	}
}

func TestRoundLog125(t *testing.T) {
	for _, tc := range []struct {
		ms       float64
		down, up float64
	}{
		{0.04, 0.02, 0.05}, {12, 10, 20}, {4650, 2000, 5000}, {1, 1, 1}, {0.6, 0.5, 1}, {7, 5, 10},
	} {
		y := math.Log10(tc.ms)
		if got := math.Pow(10, roundLog125(y, false)); math.Abs(got-tc.down) > 1e-9*tc.down {
			t.Errorf("down(%v ms) = %v, want %v", tc.ms, got, tc.down)
		}
		if got := math.Pow(10, roundLog125(y, true)); math.Abs(got-tc.up) > 1e-9*tc.up {
			t.Errorf("up(%v ms) = %v, want %v", tc.ms, got, tc.up)
		}
	}
}

// colorHex is c as SVG writes it: #RRGGBB.
func colorHex(c color.Color) string {
	r, g, b, _ := c.RGBA()
	return fmt.Sprintf("#%02X%02X%02X", r>>8, g>>8, b>>8)
}
