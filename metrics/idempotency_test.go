package metrics

import (
	"strings"
	"testing"

	"github.com/reqlock/reqlock"
)

// TestIdempotencyFamily: lock_idempotency_total appears with the first
// idempotency event, every event's series of the route at once, at zero,
// between lock_holders and lock_limit_reached_total; an event package
// reqlock does not define is not counted.
func TestIdempotencyFamily(t *testing.T) {
	m := New()
	m.Obtained("POST /orders", reqlock.OutcomeAcquired, 0)
	if text, _ := scrape(t, m); strings.Contains(text, "idempotency") {
		t.Fatalf("the family is written before its first event:\n%s", text)
	}
	m.Idempotency("POST /orders", reqlock.IdempotencyReplayed)
	m.Idempotency("POST /orders", reqlock.IdempotencyReplayed)
	m.Idempotency("POST /orders", "later")
	m.Holding("POST /exports", reqlock.HolderLimited, 1)
	text, fams := scrape(t, m)
	for event, want := range map[string]float64{"conflict": 0, "mismatch": 0, "recorded": 0, "replayed": 2} {
		if v, ok := value(fams, "reqlock_lock_idempotency_total", "event", event, "route", "POST /orders"); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", event, v, ok, want)
		}
	}
	if n := countSeries(fams, "reqlock_lock_idempotency_total"); n != 4 {
		t.Errorf("%d series, want 4 (one route, every event)", n)
	}
	holders, idem, limit := strings.Index(text, "# HELP reqlock_lock_holders"), strings.Index(text, "# HELP reqlock_lock_idempotency_total"),
		strings.Index(text, "# HELP reqlock_lock_limit_reached_total")
	if holders < 0 || idem < holders || limit < idem {
		t.Errorf("the family is out of the order of names:\n%s", text)
	}
}
