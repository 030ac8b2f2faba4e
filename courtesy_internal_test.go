package reqlock

import (
	"context"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/localqueue"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// plainStore hides every optional interface of the store it wraps: a store
// that neither signals releases nor reports waiters, as MySQL's.
type plainStore struct{ stores.Store }

// reportingStore is a plain store that reports waiters: never any.
type reportingStore struct{ stores.Store }

func (s reportingStore) ReleaseWaited(ctx context.Context, keys []string, token string, keep time.Duration) (bool, error) {
	return false, s.Release(ctx, keys, token, keep)
}

// passCourtesy passes turn on as a courtesy of yield to a new waiter of its
// key, and returns the waiter's turn.
func passCourtesy(t *testing.T, l *Locker, turn localqueue.Turn, yield time.Duration) localqueue.Turn {
	t.Helper()
	got := make(chan localqueue.Turn, 1)
	go func() {
		next, err := l.queues.Join(context.Background(), "k", true, time.Second, true)
		if err != nil {
			t.Error(err)
		}
		got <- next
	}()
	pollUntil(t, func() bool { return l.queues.Waiters("k") == 1 })
	turn.PassCourtesy(yield)
	next := <-got
	if !next.Courtesy || next.Yield != yield {
		t.Fatalf("a courtesy of %v passed as %+v", yield, next)
	}
	return next
}

// turnOf returns a fresh local turn of key in l.
func turnOf(t *testing.T, l *Locker, key string) localqueue.Turn {
	t.Helper()
	turn, err := l.queues.Join(context.Background(), key, false, time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	return turn
}

// TestYieldAfter: a process that gives a hot key back to the store holds
// back a couple of round trips, or long enough for a waiter that polls (a
// courtesy) once its turn on the key has lasted minTurn hotPolls: on a
// store that reports waiters, when it reports one; on a store that neither
// reports nor signals, for contendedFor after its own last refusal, and
// once every probeEvery all the same; on a store that signals, and in
// fair mode, never.
func TestYieldAfter(t *testing.T) {
	const rtt = time.Millisecond
	short := 2 * rtt
	long := func(l *Locker) time.Duration { return 2*l.hotPoll() + short }
	check := func(t *testing.T, what string, got time.Duration, courtesy bool, want time.Duration, wantCourtesy bool) {
		t.Helper()
		if got != want || courtesy != wantCourtesy {
			t.Fatalf("%s: yield %v (courtesy %v), want %v (courtesy %v)", what, got, courtesy, want, wantCourtesy)
		}
	}
	// courtesyAfter polls until yieldAfter gives a courtesy and returns
	// how long that took.
	courtesyAfter := func(t *testing.T, l *Locker, turns []localqueue.Turn, waited bool) time.Duration {
		t.Helper()
		start := time.Now()
		pollUntil(t, func() bool {
			_, c := l.yieldAfter(turns, waited, rtt)
			return c
		})
		return time.Since(start)
	}
	backoff := WithBackoff(time.Millisecond, 4*time.Millisecond)

	t.Run("reported", func(t *testing.T) {
		l := MustNew(reportingStore{memstore.New()}, backoff)
		if long(l) != 2*4*time.Millisecond+short {
			t.Fatalf("the courtesy %v does not follow a backoff cap below hotPollMax", long(l))
		}
		turn := turnOf(t, l, "k")
		turns := []localqueue.Turn{turn}
		y, c := l.yieldAfter(turns, true, rtt)
		check(t, "a waiter refused, early in the turn", y, c, short, false)
		if d := courtesyAfter(t, l, turns, true); d < minTurn*4*time.Millisecond-2*time.Millisecond {
			t.Fatalf("a courtesy %v into the turn, want after %v", d, minTurn*4*time.Millisecond)
		}
		y, c = l.yieldAfter(turns, true, rtt)
		check(t, "a waiter refused", y, c, long(l), true)
		y, c = l.yieldAfter(turns, false, rtt)
		check(t, "nobody refused", y, c, short, false)
		turn.Refused() // the store's report decides, not this process's past
		y, c = l.yieldAfter(turns, false, rtt)
		check(t, "nobody refused this grant", y, c, short, false)
		// A new turn begins (granted after a courtesy): no courtesy before
		// minTurn again.
		turn.TurnBegan()
		y, c = l.yieldAfter(turns, true, rtt)
		check(t, "a waiter refused, early in a new turn", y, c, short, false)
	})

	t.Run("signalled", func(t *testing.T) {
		l := MustNew(memstore.New(), backoff)
		turn := turnOf(t, l, "k")
		turn.Refused()
		time.Sleep(minTurn * 4 * time.Millisecond) // the turn's length is what is tested
		y, c := l.yieldAfter([]localqueue.Turn{turn}, false, rtt)
		check(t, "a store that signals releases", y, c, short, false)
	})

	t.Run("refused", func(t *testing.T) {
		l := MustNew(plainStore{memstore.New()}, backoff)
		turn := turnOf(t, l, "k")
		turns := []localqueue.Turn{turn}
		turn.Refused()
		refused := time.Now()
		courtesyAfter(t, l, turns, false)
		y, c := l.yieldAfter(turns, false, rtt)
		check(t, "after a refusal, at the end of a turn", y, c, long(l), true)
		// A courtesy does not end the contention: the key stays wanted
		// until contendedFor after the refusal.
		turn = passCourtesy(t, l, turn, y)
		y, c = l.yieldAfter([]localqueue.Turn{turn}, false, rtt)
		check(t, "after a courtesy", y, c, long(l), true)
		pollUntil(t, func() bool { return time.Since(refused) > contendedFor })
		turn = passCourtesy(t, l, turn, y) // no probe due either
		y, c = l.yieldAfter([]localqueue.Turn{turn}, false, rtt)
		check(t, "contendedFor after the refusal", y, c, short, false)
	})

	t.Run("probe", func(t *testing.T) {
		l := MustNew(plainStore{memstore.New()}, backoff)
		turn := turnOf(t, l, "k")
		turns := []localqueue.Turn{turn}
		y, c := l.yieldAfter(turns, false, rtt)
		check(t, "a fresh queue", y, c, short, false)
		if d := courtesyAfter(t, l, turns, false); d < probeEvery-10*time.Millisecond {
			t.Fatalf("probed %v after the queue was made, want after %v", d, probeEvery)
		}
		// The turn passes on as a courtesy: the next probe is probeEvery
		// later.
		next := passCourtesy(t, l, turn, long(l))
		y, c = l.yieldAfter([]localqueue.Turn{next}, false, rtt)
		check(t, "right after a courtesy", y, c, short, false)
	})

	t.Run("fair", func(t *testing.T) {
		l := MustNew(memstore.New(), WithFairness(time.Second), backoff)
		turn := turnOf(t, l, "k")
		turn.Refused()
		time.Sleep(minTurn * 4 * time.Millisecond) // the turn's length is what is tested
		y, c := l.yieldAfter([]localqueue.Turn{turn}, true, rtt)
		check(t, "fair mode", y, c, short, false)
	})

	t.Run("floor", func(t *testing.T) {
		l := MustNew(memstore.New())
		y, c := l.yieldAfter([]localqueue.Turn{turnOf(t, l, "k")}, false, time.Microsecond)
		check(t, "a fast release", y, c, minYield, false)
	})
}

// TestChangedHands: a waiter tells a key that changes hands between its
// attempts (its holder's remaining TTL did not shrink with the time between
// them) from one held by the same grant.
func TestChangedHands(t *testing.T) {
	at := time.Now()
	for _, c := range []struct {
		what           string
		lastWait, wait time.Duration
		lastAt         time.Time
		want           bool
	}{
		{"first refusal", 0, 9 * time.Second, time.Time{}, false},
		{"unknown remaining TTL", 0, 0, time.Time{}, true},
		{"the same grant", 10 * time.Second, 10*time.Second - 20*time.Millisecond, at.Add(-20 * time.Millisecond), false},
		{"a new grant", 9 * time.Second, 10*time.Second - time.Millisecond, at.Add(-20 * time.Millisecond), true},
		{"the same grant, with jitter", 10 * time.Second, 10*time.Second - 12*time.Millisecond, at.Add(-20 * time.Millisecond), false},
	} {
		if got := changedHands(c.lastWait, c.lastAt, c.wait, at); got != c.want {
			t.Errorf("%s: changedHands %v, want %v", c.what, got, c.want)
		}
	}
}

// pollUntil polls cond every millisecond until it holds, failing the test
// after 5s.
func pollUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
