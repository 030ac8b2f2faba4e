package zkstore

import (
	"testing"
	"time"
)

// TestAgesFirstSight: a version read for the first time lives its full life
// from then, however old it is; a new version starts again; the Store's own
// write lives from the start of its call and names its grant until it
// expires.
func TestAgesFirstSight(t *testing.T) {
	var a ages
	t0 := time.Now()
	if got := a.remaining("/n", 7, time.Second, t0); got != time.Second {
		t.Fatalf("first sight: %v left, want the full 1s", got)
	}
	if got := a.remaining("/n", 7, time.Second, t0.Add(400*time.Millisecond)); got != 600*time.Millisecond {
		t.Fatalf("same version 400ms later: %v left, want 600ms", got)
	}
	if got := a.remaining("/n", 8, time.Second, t0.Add(2*time.Second)); got != time.Second {
		t.Fatalf("new version: %v left, want the full 1s", got)
	}
	if a.live("/n", t0.Add(3*time.Second+time.Millisecond)) {
		t.Fatal("live after its life ended")
	}

	a.wrote("/own", 9, "tok", 5, time.Second, t0)
	if got := a.owned("/own", "tok", 5, t0.Add(500*time.Millisecond)); got != ownLive {
		t.Fatalf("owned: %v, want ownLive", got)
	}
	if got := a.owned("/own", "other", 5, t0); got != ownUnknown {
		t.Fatalf("owned by another token: %v, want ownUnknown", got)
	}
	if got := a.owned("/own", "tok", 5, t0.Add(time.Second)); got != ownGone {
		t.Fatalf("owned after its TTL: %v, want ownGone", got)
	}
	if got := a.owned("/own", "tok", 6, t0); got != ownGone {
		t.Fatalf("owned in another session: %v, want ownGone", got)
	}
	// A reader of the Store's own write sees the deadline the write set.
	if got := a.remaining("/own", 9, time.Second, t0.Add(300*time.Millisecond)); got != 700*time.Millisecond {
		t.Fatalf("own write read back: %v left, want 700ms", got)
	}
	a.forget("/own")
	if got := a.owned("/own", "tok", 5, t0); got != ownUnknown {
		t.Fatalf("owned after forget: %v, want ownUnknown", got)
	}
	// A write whose session ended as it returned is aged, not owned.
	a.wrote("/lost", 3, "tok", 0, time.Second, t0)
	if got := a.owned("/lost", "tok", 0, t0); got != ownUnknown {
		t.Fatalf("owned without a session: %v, want ownUnknown", got)
	}
	if !a.live("/lost", t0) {
		t.Fatal("a write without a session is not aged")
	}
}

// TestAgesSweep: sightings long past their deadline are swept once the map
// has grown, live ones are kept.
func TestAgesSweep(t *testing.T) {
	var a ages
	old := time.Now().Add(-time.Hour)
	for i := range minSweep {
		a.remaining(string(rune('a'+i%26))+string(rune(i)), 1, time.Second, old)
	}
	a.remaining("/live", 1, time.Hour, time.Now())
	a.mu.Lock()
	n := len(a.seen)
	a.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d sightings after the sweep, want 1 (the live one)", n)
	}
	if !a.live("/live", time.Now()) {
		t.Fatal("the live sighting was swept")
	}
}
