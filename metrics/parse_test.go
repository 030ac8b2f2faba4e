package metrics

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// A tiny parser of the text exposition format, version 0.0.4, strict
// enough to reject what this package must never write.

type family struct {
	name, help, typ string
	samples         []sample
}

type sample struct {
	name   string
	names  []string          // label names, in the order of the line
	labels map[string]string // unescaped label values
	value  float64
	line   string
}

// parse parses text and checks each line: HELP then TYPE once per family,
// and sample lines name{label="value",...} value of that family's names,
// with valid names, escapes and values, and no series twice.
func parse(text string) ([]family, error) {
	if text != "" && !strings.HasSuffix(text, "\n") {
		return nil, fmt.Errorf("text does not end with a newline")
	}
	var fams []family
	seenFamily := make(map[string]bool)
	seenSeries := make(map[string]bool)
	for n, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if text == "" {
			break
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("line %d %q: %s", n+1, line, fmt.Sprintf(format, args...))
		}
		switch {
		case strings.HasPrefix(line, "# HELP "):
			name, help, ok := strings.Cut(strings.TrimPrefix(line, "# HELP "), " ")
			if !ok || !validName(name) {
				return nil, fail("bad HELP")
			}
			if seenFamily[name] {
				return nil, fail("family %s again", name)
			}
			seenFamily[name] = true
			h, err := unescape(help, false)
			if err != nil {
				return nil, fail("HELP: %v", err)
			}
			fams = append(fams, family{name: name, help: h})
		case strings.HasPrefix(line, "# TYPE "):
			name, typ, ok := strings.Cut(strings.TrimPrefix(line, "# TYPE "), " ")
			if !ok || len(fams) == 0 || fams[len(fams)-1].name != name || fams[len(fams)-1].typ != "" {
				return nil, fail("TYPE not right after the HELP of its family")
			}
			switch typ {
			case "counter", "gauge", "histogram":
			default:
				return nil, fail("type %q", typ)
			}
			fams[len(fams)-1].typ = typ
		case strings.HasPrefix(line, "#"), line == "":
			return nil, fail("unexpected comment or empty line")
		default:
			if len(fams) == 0 || fams[len(fams)-1].typ == "" {
				return nil, fail("sample before HELP and TYPE")
			}
			f := &fams[len(fams)-1]
			s, err := parseSample(line)
			if err != nil {
				return nil, fail("%v", err)
			}
			allowed := []string{f.name}
			if f.typ == "histogram" {
				allowed = []string{f.name + "_bucket", f.name + "_sum", f.name + "_count"}
			}
			if !slices.Contains(allowed, s.name) {
				return nil, fail("sample %s in family %s", s.name, f.name)
			}
			key := s.name + fmt.Sprint(s.labels) // fmt sorts map keys
			if seenSeries[key] {
				return nil, fail("series twice")
			}
			seenSeries[key] = true
			f.samples = append(f.samples, s)
		}
	}
	for _, f := range fams {
		if f.typ == "" || len(f.samples) == 0 {
			return nil, fmt.Errorf("family %s without TYPE or samples", f.name)
		}
	}
	return fams, nil
}

func parseSample(line string) (sample, error) {
	s := sample{line: line, labels: make(map[string]string)}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, fmt.Errorf("no value")
	}
	s.name, line = line[:i], line[i:]
	if !validName(s.name) {
		return s, fmt.Errorf("metric name %q", s.name)
	}
	if line[0] == '{' {
		line = line[1:]
		for {
			eq := strings.Index(line, `="`)
			if eq < 0 {
				return s, fmt.Errorf("label without =\"")
			}
			name := line[:eq]
			if !validName(name) || strings.Contains(name, ":") {
				return s, fmt.Errorf("label name %q", name)
			}
			if _, dup := s.labels[name]; dup {
				return s, fmt.Errorf("label %s twice", name)
			}
			line = line[eq+2:]
			end := closingQuote(line)
			if end < 0 {
				return s, fmt.Errorf("unterminated label value")
			}
			v, err := unescape(line[:end], true)
			if err != nil {
				return s, err
			}
			if !utf8.ValidString(v) {
				return s, fmt.Errorf("label value %q not UTF-8", v)
			}
			s.names = append(s.names, name)
			s.labels[name] = v
			line = line[end+1:]
			if strings.HasPrefix(line, ",") {
				line = line[1:]
				continue
			}
			if !strings.HasPrefix(line, "}") {
				return s, fmt.Errorf("label list not closed")
			}
			line = line[1:]
			break
		}
	}
	if !strings.HasPrefix(line, " ") {
		return s, fmt.Errorf("no space before the value")
	}
	v, err := strconv.ParseFloat(line[1:], 64)
	if err != nil || strings.ContainsAny(line[1:], " \t_") {
		return s, fmt.Errorf("value %q", line[1:])
	}
	s.value = v
	return s, nil
}

// closingQuote returns the index of the first unescaped double quote in s.
func closingQuote(s string) int {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// unescape undoes the escapes of the format: \\ and \n, and \" in label
// values (quoted); any other backslash, and a bare newline or quote, is an
// error.
func unescape(s string, quoted bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			if i+1 == len(s) {
				return "", fmt.Errorf("trailing backslash in %q", s)
			}
			i++
			switch s[i] {
			case '\\':
				b.WriteByte('\\')
			case 'n':
				b.WriteByte('\n')
			case '"':
				if !quoted {
					return "", fmt.Errorf(`\" in %q`, s)
				}
				b.WriteByte('"')
			default:
				return "", fmt.Errorf("escape \\%c in %q", s[i], s)
			}
		case c == '\n', c == '"' && quoted:
			return "", fmt.Errorf("unescaped %q in %q", c, s)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// checkExposition parses text and checks everything a scrape must satisfy:
// well-formed lines, families in the order of their names, series in the
// order of their label values, and consistent histograms.
func checkExposition(t testing.TB, text string) []family {
	t.Helper()
	fams, err := parse(text)
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	if !slices.IsSortedFunc(fams, func(x, y family) int { return strings.Compare(x.name, y.name) }) {
		t.Errorf("families not in the order of their names")
	}
	for _, f := range fams {
		var groups [][]string // label values of each series, in label name order
		for _, s := range f.samples {
			if !slices.Equal(s.names, sortedNames(s.labels)) {
				t.Errorf("%s: labels %v not in the order of their names", s.line, s.names)
			}
			vals := seriesValues(s.labels)
			if len(groups) == 0 || !slices.Equal(groups[len(groups)-1], vals) {
				groups = append(groups, vals)
			}
		}
		if !slices.IsSortedFunc(groups, slices.Compare[[]string]) {
			t.Errorf("%s: series not in the order of their label values: %v", f.name, groups)
		}
		if f.typ == "histogram" {
			checkHistograms(t, f)
		}
	}
	return fams
}

// sortedNames returns the label names in the order the format writes them:
// sorted, le last.
func sortedNames(labels map[string]string) []string {
	names := slices.Sorted(maps.Keys(labels))
	if i := slices.Index(names, "le"); i >= 0 {
		names = append(slices.Delete(names, i, i+1), "le")
	}
	return names
}

// seriesValues returns the label values but le's, in label name order.
func seriesValues(labels map[string]string) []string {
	var vals []string
	for _, n := range sortedNames(labels) {
		if n != "le" {
			vals = append(vals, labels[n])
		}
	}
	return vals
}

// checkHistograms checks each histogram of f: _bucket lines with le
// increasing to +Inf and counts not decreasing, then _sum, then _count
// equal to the +Inf bucket.
func checkHistograms(t testing.TB, f family) {
	t.Helper()
	var (
		prevLe    = math.Inf(-1)
		prevCount float64
		inf       = -1.0
		state     = "bucket" // what may come next
	)
	for i, s := range f.samples {
		switch strings.TrimPrefix(s.name, f.name) {
		case "_bucket":
			if state == "count" || state == "sum" {
				t.Errorf("%s: bucket after the +Inf bucket", s.line)
			}
			le, err := strconv.ParseFloat(s.labels["le"], 64)
			if err != nil {
				t.Errorf("%s: le: %v", s.line, err)
			}
			if i > 0 && f.samples[i-1].name == f.name+"_bucket" && !(le > prevLe) {
				t.Errorf("%s: le not increasing", s.line)
			}
			if i > 0 && f.samples[i-1].name == f.name+"_bucket" && s.value < prevCount {
				t.Errorf("%s: bucket counts not cumulative", s.line)
			}
			if s.value != math.Trunc(s.value) || s.value < 0 {
				t.Errorf("%s: bucket count not a whole number", s.line)
			}
			prevLe, prevCount = le, s.value
			if math.IsInf(le, +1) {
				inf, state = s.value, "sum"
			}
		case "_sum":
			if state != "sum" {
				t.Errorf("%s: _sum not right after the +Inf bucket", s.line)
			}
			if _, ok := s.labels["le"]; ok {
				t.Errorf("%s: _sum with le", s.line)
			}
			state = "count"
		case "_count":
			if state != "count" {
				t.Errorf("%s: _count not right after _sum", s.line)
			}
			if s.value != inf {
				t.Errorf("%s: count %v, +Inf bucket %v", s.line, s.value, inf)
			}
			state, prevLe, prevCount = "bucket", math.Inf(-1), 0
		}
	}
	if state != "bucket" {
		t.Errorf("%s: last histogram incomplete", f.name)
	}
}

// scrape returns m's exposition, checked.
func scrape(t testing.TB, m *Registry) (string, []family) {
	t.Helper()
	var b bytes.Buffer
	n, err := m.WriteTo(&b)
	if err != nil || n != int64(b.Len()) {
		t.Fatalf("WriteTo: %d, %v; wrote %d bytes", n, err, b.Len())
	}
	return b.String(), checkExposition(t, b.String())
}

// value returns the value of the sample name with exactly the labels given
// as name, value pairs, and whether there is one.
func value(fams []family, name string, labels ...string) (float64, bool) {
	want := make(map[string]string)
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, f := range fams {
		for _, s := range f.samples {
			if s.name == name && maps.Equal(s.labels, want) {
				return s.value, true
			}
		}
	}
	return 0, false
}

// labelValues returns the distinct values of label among the samples of
// family name, sorted.
func labelValues(fams []family, name, label string) []string {
	var vals []string
	for _, f := range fams {
		if f.name != name {
			continue
		}
		for _, s := range f.samples {
			if v, ok := s.labels[label]; ok && !slices.Contains(vals, v) {
				vals = append(vals, v)
			}
		}
	}
	slices.SortFunc(vals, cmp.Compare[string])
	return vals
}

// countSeries returns how many series family name has (a histogram's
// _bucket, _sum and _count lines are one series).
func countSeries(fams []family, name string) int {
	for _, f := range fams {
		if f.name != name {
			continue
		}
		n := 0
		for _, s := range f.samples {
			if f.typ == "counter" || s.name == name+"_count" {
				n++
			}
		}
		return n
	}
	return 0
}

// TestParser: the parser itself rejects malformed lines.
func TestParser(t *testing.T) {
	const head = "# HELP a_total x\n# TYPE a_total counter\n"
	good := head + "a_total{route=\"p \\\"q\\\" \\\\ \\n\"} 1\na_total{route=\"z\"} +Inf\n"
	fams, err := parse(good)
	if err != nil {
		t.Fatalf("parse good: %v", err)
	}
	if v := fams[0].samples[0].labels["route"]; v != "p \"q\" \\ \n" {
		t.Fatalf("unescaped %q", v)
	}
	for _, bad := range []string{
		head + "a_total{route=\"x\"} 1",                           // no final newline
		head + "a_total{route=\"x\"}  1\n",                        // two spaces
		head + "a_total{route=\"x\"} one\n",                       // value
		head + "a_total{route=\"x\",} 1\n",                        // trailing comma
		head + "a_total{route=\"x\\t\"} 1\n",                      // escape
		head + "a_total{route=\"x\"y\"} 1\n",                      // bare quote
		head + "a_total{route=\"x\",route=\"y\"} 1\n",             // label twice
		head + "a_total{1route=\"x\"} 1\n",                        // label name
		head + "b_total{route=\"x\"} 1\n",                         // other family
		head + "a_total{route=\"x\"} 1\na_total{route=\"x\"} 2\n", // series twice
		"a_total 1\n",                         // no HELP, TYPE
		"# TYPE a_total counter\na_total 1\n", // TYPE without HELP
		head,                                  // family without samples
		head + "\n",                           // empty line
		"# HELP a_total x\n# TYPE a_total gauge_x\na_total 1\n",
		head + "a_total 1\n" + head + "a_total{b=\"c\"} 1\n", // family twice
		head + "a_total 1 1700000000\n",                      // timestamp
	} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse accepted %q", bad)
		}
	}
}
