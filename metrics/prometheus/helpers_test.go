package reqlockprom

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// registered returns m registered on a new pedantic registry, which checks
// each collected metric against the descriptions.
func registered(t testing.TB, m *Metrics) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatalf("Register: %v", err)
	}
	return reg
}

// series returns the metrics of the family name whose labels include all
// of want.
func series(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var found []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			got := make(map[string]string)
			for _, l := range s.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if contains(got, want) {
				found = append(found, s)
			}
		}
	}
	return found
}

func contains(got, want map[string]string) bool {
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			return false
		}
	}
	return true
}

// counter returns the value of the one counter of family name with labels
// want, and whether it exists.
func counter(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	t.Helper()
	s := series(t, g, name, want)
	switch len(s) {
	case 0:
		return 0, false
	case 1:
		return s[0].GetCounter().GetValue(), true
	}
	t.Fatalf("%s%v: %d series, want one", name, want, len(s))
	return 0, false
}

// histogram returns the sample count and sum of the one histogram of
// family name with labels want, and whether it exists.
func histogram(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) (uint64, float64, bool) {
	t.Helper()
	s := series(t, g, name, want)
	switch len(s) {
	case 0:
		return 0, 0, false
	case 1:
		h := s[0].GetHistogram()
		return h.GetSampleCount(), h.GetSampleSum(), true
	}
	t.Fatalf("%s%v: %d series, want one", name, want, len(s))
	return 0, 0, false
}

// labelValues returns the distinct values of label among the series of
// family name.
func labelValues(t testing.TB, g prometheus.Gatherer, name, label string) map[string]bool {
	t.Helper()
	values := make(map[string]bool)
	for _, s := range series(t, g, name, nil) {
		for _, l := range s.GetLabel() {
			if l.GetName() == label {
				values[l.GetValue()] = true
			}
		}
	}
	return values
}

// value returns the value of the one counter or gauge of family name with
// labels want, and whether it exists.
func value(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	t.Helper()
	s := series(t, g, name, want)
	switch len(s) {
	case 0:
		return 0, false
	case 1:
		if s[0].GetGauge() != nil {
			return s[0].GetGauge().GetValue(), true
		}
		return s[0].GetCounter().GetValue(), true
	}
	t.Fatalf("%s%v: %d series, want one", name, want, len(s))
	return 0, false
}
