package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestReadWorkLog reads the example's -worklog lines, quoted keys and
// routes included.
func TestReadWorkLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.log")
	data := "10 20 true \"r 1\" \"GET /reports/{id}\"\n30 35 false \"t\" \"POST /exports\"\n"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readWorkLog(path, 1)
	want := []span{{10, 20, true, "r 1", routeReport, 1}, {30, 35, false, "t", routeExports, 1}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("readWorkLog: %v, %v; want %v", got, err, want)
	}
	if err := os.WriteFile(path, []byte("10 x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readWorkLog(path, 0); err == nil {
		t.Fatal("a bad line: no error")
	}
}

// TestExclusiveOverlaps counts a rebuild that overlaps a read before it, a
// rebuild that overlaps a read after it (on another instance), and not
// spans that only touch, nor spans of other keys.
func TestExclusiveOverlaps(t *testing.T) {
	r := func(start, end int64, route string, inst int) span {
		return span{start: start, end: end, key: "a", route: route, inst: inst}
	}
	for _, tc := range []struct {
		spans []span
		want  int
	}{
		{[]span{r(0, 10, routeReport, 0), r(0, 10, routeReport, 1), r(10, 20, routeRebuild, 0), r(20, 30, routeReport, 1)}, 0},
		{[]span{r(0, 10, routeReport, 0), r(1, 9, routeReport, 1), r(9, 20, routeRebuild, 0)}, 1},
		{[]span{r(0, 50, routeReport, 0), r(10, 20, routeReport, 0), r(30, 40, routeRebuild, 1)}, 1},
		{[]span{r(0, 10, routeRebuild, 0), r(5, 15, routeReport, 1)}, 1},
		{[]span{r(0, 10, routeRebuild, 0), r(5, 15, routeRebuild, 1)}, 2},
		{[]span{r(0, 10, routeRebuild, 0), {start: 5, end: 15, key: "b", route: routeReport}}, 0},
	} {
		if got := exclusiveOverlaps(tc.spans, routeRebuild); got != tc.want {
			t.Errorf("%v: %d overlaps, want %d", tc.spans, got, tc.want)
		}
	}
}

// TestRunningAndBusy: withoutStop cuts the stopped instance's time out of
// its spans only, maxRunning counts spans at once (touching ones apart),
// busy sums work inside a window.
func TestRunningAndBusy(t *testing.T) {
	spans := []span{
		{start: 0, end: 100, inst: 1},  // stopped from 10 to 90: runs 0-10 and 90-100
		{start: 20, end: 50, inst: 1},  // entirely stopped
		{start: 10, end: 40, inst: 0},  // another instance: untouched
		{start: 40, end: 95, inst: 0},  // touches the one before
		{start: 45, end: 95, inst: 0},  //
		{start: 80, end: 100, inst: 0}, //
	}
	cut := withoutStop(spans, 1, 10, 90)
	want := []span{{start: 0, end: 10, inst: 1}, {start: 90, end: 100, inst: 1},
		spans[2], spans[3], spans[4], spans[5]}
	if !slices.Equal(cut, want) {
		t.Fatalf("withoutStop: %v, want %v", cut, want)
	}
	if n, at := maxRunning(cut); n != 4 || at != 90 {
		t.Errorf("maxRunning: %d at %d, want 4 at 90", n, at)
	}
	if n, _ := maxRunning(cut[:4]); n != 2 {
		t.Errorf("maxRunning of spans that touch: %d, want 2", n)
	}
	if got := busy(cut, 0, 50); got != time.Duration(10+30+10+5) {
		t.Errorf("busy in [0, 50]: %v, want 55ns", got)
	}
}
