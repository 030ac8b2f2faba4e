package main

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"slices"
	"time"
)

// span is one handler's work: a line of an instance's -worklog.
type span struct {
	start, end int64 // Unix nanoseconds
	ok         bool  // the work ran to its end
	key, route string
	inst       int // which instance logged it
}

// readWorkLog reads the work log at path of instance inst.
func readWorkLog(path string, inst int) ([]span, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var spans []span
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		s := span{inst: inst}
		if _, err := fmt.Sscanf(sc.Text(), "%d %d %t %q %q", &s.start, &s.end, &s.ok, &s.key, &s.route); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		spans = append(spans, s)
	}
	return spans, sc.Err()
}

// exclusiveOverlaps counts the spans of route that overlap another span of
// the same key, whatever its route and instance.
func exclusiveOverlaps(spans []span, route string) int {
	byKey := map[string][]span{}
	for _, s := range spans {
		byKey[s.key] = append(byKey[s.key], s)
	}
	n := 0
	for _, ks := range byKey {
		slices.SortFunc(ks, func(a, b span) int { return cmp.Compare(a.start, b.start) })
		var maxEnd int64 // of ks[:i]
		for i, s := range ks {
			if s.route == route && ((i > 0 && maxEnd > s.start) || (i+1 < len(ks) && ks[i+1].start < s.end)) {
				n++
			}
			maxEnd = max(maxEnd, s.end)
		}
	}
	return n
}

// withoutStop returns spans with the part of instance inst's spans inside
// [from, to] cut out: that instance ran nothing then.
func withoutStop(spans []span, inst int, from, to int64) []span {
	var out []span
	for _, s := range spans {
		if s.inst != inst || s.end <= from || s.start >= to {
			out = append(out, s)
			continue
		}
		if s.start < from {
			a := s
			a.end = from
			out = append(out, a)
		}
		if s.end > to {
			b := s
			b.start = to
			out = append(out, b)
		}
	}
	return out
}

// maxRunning returns the most spans running at once (one that ends when
// another starts does not overlap it) and when that first happened.
func maxRunning(spans []span) (int, int64) {
	type event struct {
		at    int64
		delta int
	}
	events := make([]event, 0, 2*len(spans))
	for _, s := range spans {
		events = append(events, event{s.start, 1}, event{s.end, -1})
	}
	slices.SortFunc(events, func(a, b event) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
	running, most, at := 0, 0, int64(0)
	for _, e := range events {
		running += e.delta
		if running > most {
			most, at = running, e.at
		}
	}
	return most, at
}

// busy returns the work time of spans inside [from, to].
func busy(spans []span, from, to int64) time.Duration {
	var d int64
	for _, s := range spans {
		d += max(0, min(s.end, to)-max(s.start, from))
	}
	return time.Duration(d)
}
