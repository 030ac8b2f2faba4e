package metrics

import (
	"cmp"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/reqlock/reqlock/internal/metricdefs"
)

// ContentType is the media type of the text exposition format, version
// 0.0.4, that ServeHTTP and WriteTo produce.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// The metric families, in the order of their names, which is the order of
// the exposition.
const (
	famFailure = iota
	famHandoffs
	famHold
	famLost
	famSuccess
	famWait
	numFamilies
)

// families are the names without namespace, HELP texts and types of the
// metrics, in the order of the fam constants.
var families = [numFamilies]struct{ name, help, typ string }{
	famFailure:  {metricdefs.NameFailure, metricdefs.HelpFailure, "counter"},
	famHandoffs: {metricdefs.NameHandoffs, metricdefs.HelpHandoffs, "counter"},
	famHold:     {metricdefs.NameHold, metricdefs.HelpHold, "histogram"},
	famLost:     {metricdefs.NameLost, metricdefs.HelpLost, "counter"},
	famSuccess:  {metricdefs.NameSuccess, metricdefs.HelpSuccess, "counter"},
	famWait:     {metricdefs.NameWait, metricdefs.HelpWait, "histogram"},
}

// ServeHTTP implements http.Handler: it writes all metrics in the text
// exposition format, version 0.0.4, with Content-Type ContentType, whatever
// the method and the Accept header. Mount it as the scrape target:
//
//	mux.Handle("GET /metrics", reg)
func (m *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b := m.appendText(nil)
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b) //nolint:errcheck // the client went away; nothing to do
}

// WriteTo implements io.WriterTo: it writes all metrics to w in the text
// exposition format, version 0.0.4, and returns the number of bytes written
// and the error of w.
func (m *Registry) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(m.appendText(nil))
	return int64(n), err
}

// appendText appends all metrics in the text exposition format, version
// 0.0.4, to b and returns the extended buffer.
//
// The families come in the order of their names, each with its HELP and
// TYPE lines, and a family without series is left out. The series of a
// family come in the order of their label values, taken in the order of
// the label names (reason before route; result before route), as the
// Prometheus client library orders them. A route's counters appear, at
// zero, with the route's first event; a histogram appears with its first
// observation. The families of the store's outages and pending releases
// (reqlock.OutageMetrics) appear with the first of their events, and
// those of reqlock.ModeMetrics with a route's first event of a mode, and
// lock_idempotency_total with a route's first reqlock.IdempotencyMetrics
// event, every event's series at once.
func (m *Registry) appendText(b []byte) []byte {
	start := len(b)
	b = slices.Grow(b, int(m.lastSize.Load())*9/8) // the last size, and some
	routes := m.routes.All()
	slices.SortFunc(routes, func(x, y *route) int { return strings.Compare(x.name, y.name) })

	known := metricdefs.KnownOutcomes()
	var failures []counterSample
	var waits []histSample
	for _, r := range routes {
		for i := 1; i < len(known); i++ {
			failures = append(failures, counterSample{string(known[i]), r.name, r.failure[i].Load()})
		}
		for i := range known {
			if h := r.wait[i].Load(); h != nil {
				waits = appendHist(waits, string(known[i]), r.name, h)
			}
		}
		r.other.Each(func(reason string, s *otherSeries) {
			failures = append(failures, counterSample{reason, r.name, s.failure.Load()})
			waits = appendHist(waits, reason, r.name, s.wait)
		})
	}
	slices.SortFunc(failures, func(x, y counterSample) int {
		return cmp.Or(strings.Compare(x.first, y.first), strings.Compare(x.route, y.route))
	})
	slices.SortFunc(waits, func(x, y histSample) int {
		return cmp.Or(strings.Compare(x.first, y.first), strings.Compare(x.route, y.route))
	})

	for f := range numFamilies {
		switch f {
		case famLost:
			// lock_holders, lock_idempotency_total and
			// lock_limit_reached_total fall between lock_hold_seconds
			// and lock_lost_total.
			b = m.appendHolders(b, routes)
			b = m.appendIdempotency(b, routes)
			b = m.appendLimitReached(b, routes)
		case famSuccess:
			// The outage families' names fall between lock_lost_total
			// and lock_success_total.
			b = m.appendOutage(b, routes)
		}
		switch f {
		case famFailure:
			if len(failures) == 0 {
				continue
			}
			b = m.appendHeader(b, f)
			for _, s := range failures {
				b = appendSample(b, m.names[f], "", metricdefs.LabelReason, s.first, s.route, "", float64(s.value))
			}
		case famWait:
			if len(waits) == 0 {
				continue
			}
			b = m.appendHeader(b, f)
			for _, s := range waits {
				b = appendHistogram(b, m.names[f], metricdefs.LabelResult, s, m.waitLe)
			}
		case famHold:
			var holds []histSample
			for _, r := range routes {
				if h := r.hold.Load(); h != nil {
					holds = appendHist(holds, "", r.name, h)
				}
			}
			if len(holds) == 0 {
				continue
			}
			b = m.appendHeader(b, f)
			for _, s := range holds {
				b = appendHistogram(b, m.names[f], "", s, m.holdLe)
			}
		default: // counters by route alone
			if len(routes) == 0 {
				continue
			}
			b = m.appendHeader(b, f)
			for _, r := range routes {
				var v uint64
				switch f {
				case famSuccess:
					v = r.success.Load()
				case famLost:
					v = r.lost.Load()
				case famHandoffs:
					v = r.handoffs.Load()
				}
				b = appendSample(b, m.names[f], "", "", "", r.name, "", float64(v))
			}
		}
	}
	m.lastSize.Store(int64(len(b) - start))
	return b
}

type counterSample struct {
	first, route string // first: the value of the label before route, if any
	value        uint64
}

type histSample struct {
	first, route string
	cum          []uint64 // cumulative counts of the finite buckets
	count        uint64
	sum          float64
}

// appendHist appends a snapshot of h unless h has no observation yet.
func appendHist(s []histSample, first, route string, h *histogram) []histSample {
	cum := make([]uint64, len(h.bounds))
	count, sum := h.snapshot(cum)
	if count == 0 {
		return s
	}
	return append(s, histSample{first, route, cum, count, sum})
}

func (m *Registry) appendHeader(b []byte, f int) []byte {
	b = append(b, "# HELP "...)
	b = append(b, m.names[f]...)
	b = append(b, ' ')
	b = appendEscaped(b, families[f].help, false)
	b = append(b, "\n# TYPE "...)
	b = append(b, m.names[f]...)
	b = append(b, ' ')
	b = append(b, families[f].typ...)
	return append(b, '\n')
}

// appendHistogram appends the _bucket, _sum and _count lines of s;
// firstName is the name of the label before route, if any.
func appendHistogram(b []byte, name, firstName string, s histSample, le []string) []byte {
	for i, c := range s.cum {
		b = appendSample(b, name, "_bucket", firstName, s.first, s.route, le[i], float64(c))
	}
	b = appendSample(b, name, "_bucket", firstName, s.first, s.route, "+Inf", float64(s.count))
	b = appendSample(b, name, "_sum", firstName, s.first, s.route, "", s.sum)
	return appendSample(b, name, "_count", firstName, s.first, s.route, "", float64(s.count))
}

// appendSample appends one sample line: name+suffix, the labels firstName
// (when not empty), route and le (when not empty), and the value.
func appendSample(b []byte, name, suffix, firstName, first, route, le string, v float64) []byte {
	b = append(b, name...)
	b = append(b, suffix...)
	b = append(b, '{')
	if firstName != "" {
		b = append(b, firstName...)
		b = append(b, `="`...)
		b = appendEscaped(b, first, true)
		b = append(b, `",`...)
	}
	b = append(b, metricdefs.LabelRoute+`="`...)
	b = appendEscaped(b, route, true)
	b = append(b, '"')
	if le != "" {
		b = append(b, `,le="`...)
		b = append(b, le...)
		b = append(b, '"')
	}
	b = append(b, "} "...)
	b = appendFloat(b, v)
	return append(b, '\n')
}

// appendEscaped appends s escaped as the text format requires: a backslash
// and a newline always, a double quote in label values (quote).
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendFloat formats f as the Prometheus client library does: +Inf, -Inf,
// NaN, and otherwise the shortest representation that reads back as f
// (strconv 'g' format, so 1e+06 for a million).
func appendFloat(b []byte, f float64) []byte {
	switch {
	case f == 0:
		return append(b, '0')
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, +1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}
