package localqueue

import (
	"context"
	"testing"
	"time"
)

// next queues a waiter for key and returns the turn it gets once passed.
func next(t *testing.T, qs *Queues, key string) <-chan Turn {
	t.Helper()
	got := make(chan Turn, 1)
	go func() {
		turn, err := qs.Join(context.Background(), key, true, time.Second, true)
		if err != nil {
			t.Error(err)
		}
		got <- turn
	}()
	deadline := time.Now().Add(5 * time.Second)
	for qs.Waiters(key) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue within 5s")
		}
		time.Sleep(time.Millisecond)
	}
	return got
}

// TestCourtesy: a turn passed as a courtesy reaches the next waiter with its
// yield and marked so, and the queue records when; a plain pass does not.
func TestCourtesy(t *testing.T) {
	qs := New()
	first, err := qs.Join(context.Background(), "k", true, time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	made := first.Contention().CourtesyAt
	got := next(t, qs, "k")
	before := time.Now()
	first.PassCourtesy(20 * time.Millisecond)
	second := <-got
	if !second.Courtesy || second.Yield != 20*time.Millisecond || !second.AfterHeld {
		t.Fatalf("a courtesy passed as %+v", second)
	}
	if at := second.Contention().CourtesyAt; at.Before(before) || !made.Before(before) {
		t.Fatalf("the queue's last courtesy %v, want at the pass (after %v)", at, before)
	}
	got = next(t, qs, "k")
	second.Pass(time.Millisecond, false)
	if third := <-got; third.Courtesy || third.Yield != time.Millisecond {
		t.Fatalf("a plain pass passed as %+v", third)
	}
}

// TestContention: a refusal and the beginning of a turn are recorded for
// the queue, whatever turn records them, and stay when the turn passes on.
func TestContention(t *testing.T) {
	qs := New()
	before := time.Now()
	first, err := qs.Join(context.Background(), "k", true, time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	c := first.Contention()
	if !c.RefusedAt.IsZero() || c.TurnAt.Before(before) || c.CourtesyAt.Before(before) {
		t.Fatalf("a fresh queue: %+v, want no refusal, its turn and courtesy from when it was made", c)
	}
	before = time.Now()
	first.Refused()
	got := next(t, qs, "k")
	first.Pass(0, true)
	second := <-got
	second.TurnBegan()
	for _, turn := range []Turn{first, second} {
		if c := turn.Contention(); c.RefusedAt.Before(before) || c.TurnAt.Before(before) {
			t.Fatalf("%+v: want the refusal and the turn recorded after %v", c, before)
		}
	}
	var none Turn
	none.Refused()
	none.TurnBegan()
	if c := none.Contention(); c != (Contention{}) {
		t.Fatal("no turn has contention")
	}
}
