package reqlockprom

import (
	"fmt"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

// BenchmarkObtained: one Obtained of a route already seen.
func BenchmarkObtained(b *testing.B) {
	m := New()
	m.Obtained("POST /skus/{id}/deduct", reqlock.OutcomeAcquired, time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		m.Obtained("POST /skus/{id}/deduct", reqlock.OutcomeAcquired, time.Millisecond)
	}
}

// BenchmarkLockCycle: the events of one obtained and released lock, on
// one of 100 routes already seen, from all Ps at once.
func BenchmarkLockCycle(b *testing.B) {
	m := New()
	routes := make([]string, 100)
	for i := range routes {
		routes[i] = fmt.Sprintf("POST /r%d/{id}", i)
		m.Obtained(routes[i], reqlock.OutcomeAcquired, 0)
		m.Held(routes[i], 0)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			route := routes[i%len(routes)]
			m.Obtained(route, reqlock.OutcomeAcquired, time.Millisecond)
			m.Held(route, 10*time.Millisecond)
			i++
		}
	})
}

// BenchmarkOverflow: Obtained of a route beyond the cap, which goes to
// route="other" every time.
func BenchmarkOverflow(b *testing.B) {
	m := New(WithMaxRoutes(1))
	m.Obtained("POST /a", reqlock.OutcomeAcquired, 0)
	m.Obtained("POST /b", reqlock.OutcomeAcquired, 0)
	b.ReportAllocs()
	for b.Loop() {
		m.Obtained("POST /b", reqlock.OutcomeAcquired, time.Millisecond)
	}
}
