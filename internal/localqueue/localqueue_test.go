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

// TestPassFreed: a turn passed after a release the store confirmed is
// AfterHeld with FreedAt; a waiter whose wait ends in the queue soon after
// counts the key seen held (its holder was just there), one whose wait ends
// after a longer silence of the store than its time behind the holder and
// FreedGrace does not.
func TestPassFreed(t *testing.T) {
	for _, c := range []struct {
		name  string
		after time.Duration // from the pass to the end of the third's wait
		seen  bool
	}{{"soon", 0, true}, {"late", 4 * FreedGrace, false}} {
		t.Run(c.name, func(t *testing.T) {
			qs := New()
			first, err := qs.Join(context.Background(), "k", true, time.Second, true)
			if err != nil {
				t.Fatal(err)
			}
			first.Hold(fixedHolder(time.Now().Add(time.Hour)))
			got := next(t, qs, "k")
			ctx, cancel := context.WithCancel(context.Background())
			third := make(chan Turn, 1)
			go func() {
				turn, _ := qs.Join(ctx, "k", true, time.Second, true)
				third <- turn
			}()
			deadline := time.Now().Add(5 * time.Second)
			for qs.Waiters("k") < 2 {
				if time.Now().After(deadline) {
					t.Fatal("the third waiter did not queue within 5s")
				}
				time.Sleep(time.Millisecond)
			}
			first.PassFreed(0, false)
			if second := <-got; !second.AfterHeld || second.FreedAt.IsZero() {
				t.Fatalf("the turn after a confirmed release: %+v, want AfterHeld and FreedAt", second)
			}
			time.Sleep(c.after) // the new contender's store call, unanswered
			cancel()
			if turn := <-third; turn.AfterHeld != c.seen {
				t.Fatalf("a wait that ended %v after the release: AfterHeld %v, want %v", c.after, turn.AfterHeld, c.seen)
			}
		})
	}
}

type fixedHolder time.Time

func (h fixedHolder) ValidUntil() time.Time { return time.Time(h) }
