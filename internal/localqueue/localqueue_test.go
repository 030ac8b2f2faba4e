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
	_, made := first.Contention()
	got := next(t, qs, "k")
	before := time.Now()
	first.PassCourtesy(20 * time.Millisecond)
	second := <-got
	if !second.Courtesy || second.Yield != 20*time.Millisecond || !second.AfterHeld {
		t.Fatalf("a courtesy passed as %+v", second)
	}
	if _, at := second.Contention(); at.Before(before) || !made.Before(before) {
		t.Fatalf("the queue's last courtesy %v, want at the pass (after %v)", at, before)
	}
	got = next(t, qs, "k")
	second.Pass(time.Millisecond, false)
	if third := <-got; third.Courtesy || third.Yield != time.Millisecond {
		t.Fatalf("a plain pass passed as %+v", third)
	}
}

// TestContention: a refusal marks the key wanted by another owner, for the
// queue whatever turn records it, until courtesies in a row go unused.
func TestContention(t *testing.T) {
	qs := New()
	first, err := qs.Join(context.Background(), "k", true, time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	contended := func(turn Turn) bool { c, _ := turn.Contention(); return c }
	if contended(first) {
		t.Fatal("a fresh queue counts as contended")
	}
	first.Refused()
	got := next(t, qs, "k")
	first.Pass(0, true)
	second := <-got
	if !contended(second) || !contended(first) {
		t.Fatal("a refusal was forgotten when the turn passed on")
	}
	second.Unused()
	if !contended(second) {
		t.Fatal("one unused courtesy cleared the contention")
	}
	second.Refused()
	second.Unused()
	if !contended(second) {
		t.Fatal("an unused courtesy after a refusal cleared the contention")
	}
	second.Unused()
	if contended(second) {
		t.Fatalf("%d unused courtesies in a row left the key contended", maxUnused)
	}
	var none Turn
	none.Refused()
	none.Unused()
	if c, at := none.Contention(); c || !at.IsZero() {
		t.Fatal("no turn has contention")
	}
}
