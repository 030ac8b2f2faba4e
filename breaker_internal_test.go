package reqlock

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/sony/gobreaker/v2"

	"github.com/reqlock/reqlock/stores/memstore"
)

// TestStoreHealthIsNeverTorn: StoreHealth reads Down and Outages as one
// state. The breaker goes down and back again and again while a reader
// polls: after it saw the store back with n outages, the next outage must
// show Outages above n, never Down with the old count.
func TestStoreHealthIsNeverTorn(t *testing.T) {
	l := MustNew(memstore.New(), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	b := l.breaker
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 5000 {
			b.changed("", gobreaker.StateClosed, gobreaker.StateOpen)
			b.changed("", gobreaker.StateOpen, gobreaker.StateClosed)
		}
		stop.Store(true)
	}()
	var last StoreHealth
	for !stop.Load() {
		h := l.StoreHealth()
		if h.Down && !last.Down && h.Outages == last.Outages {
			t.Fatalf("torn read: down with %d outages, as many as while it was up", h.Outages)
		}
		last = h
	}
	<-done
}
