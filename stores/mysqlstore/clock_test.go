package mysqlstore

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

// TestReleaseSurvivesClockStepBack (issue 18, defect 18): a released key is
// free whatever the server's clock says afterwards. The clock stepping back
// by an hour is emulated by a Store whose connections run with the session
// timestamp an hour behind (SET timestamp, which moves UTC_TIMESTAMP, the
// clock of every statement). Released keys used to be marked free by an
// expiry of "now": after the step they read as held for an hour, refusing
// every waiter, and the released holder's Refresh took them back.
func TestReleaseSurvivesClockStepBack(t *testing.T) {
	back := time.Now().Add(-time.Hour)
	stepped := openDB(t, withParam("timestamp", strconv.FormatFloat(float64(back.UnixMicro())/1e6, 'f', 6, 64)))
	var clock int64 // µs since 1970
	if err := stepped.QueryRowContext(t.Context(), "SELECT "+microsSQL).Scan(&clock); err != nil {
		t.Fatalf("read the stepped clock: %v", err)
	}
	if d := time.Since(time.UnixMicro(clock)); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("the session clock is %v behind, want an hour", d)
	}
	before := newStore(t, openDB(t))
	after := newStore(t, stepped)
	for _, n := range []int{1, 3} {
		keys := testKeys(n)
		first := mustAcquire(t, before, keys, "t1", time.Minute)
		if err := before.Release(t.Context(), keys, "t1", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
		// The clock has stepped back an hour.
		if err := after.Refresh(t.Context(), keys, "t1", time.Minute); !errors.Is(err, stores.ErrNotHeld) {
			t.Fatalf("%d keys: Refresh of a released grant after the clock stepped back: %v, want ErrNotHeld", n, err)
		}
		g, err := after.Acquire(t.Context(), keys, "t2", time.Minute)
		if err != nil || !g.OK {
			t.Fatalf("%d keys: Acquire of a released key after the clock stepped back: %+v, %v; want granted", n, g, err)
		}
		for i := range keys {
			if g.Fences[i]-first.Fences[i] < stores.FenceStride {
				t.Fatalf("%d keys: fence %d after %d, want a stride above", n, g.Fences[i], first.Fences[i])
			}
		}
		if err := after.Release(t.Context(), keys, "t2", 0); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}
