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

	a.wrote("/own", 9, 2, 5, "tok", time.Second, t0)
	if v, pv, ok := a.owned("/own", "tok", t0.Add(500*time.Millisecond)); !ok || v != 2 || pv != 5 {
		t.Fatalf("owned: %d, %d, %v; want 2, 5, true", v, pv, ok)
	}
	if _, _, ok := a.owned("/own", "other", t0); ok {
		t.Fatal("owned by another token")
	}
	if _, _, ok := a.owned("/own", "tok", t0.Add(time.Second)); ok {
		t.Fatal("owned after its TTL")
	}
	// A reader of the Store's own write sees the deadline the write set.
	if got := a.remaining("/own", 9, time.Second, t0.Add(300*time.Millisecond)); got != 700*time.Millisecond {
		t.Fatalf("own write read back: %v left, want 700ms", got)
	}
	a.forget("/own")
	if _, _, ok := a.owned("/own", "tok", t0); ok {
		t.Fatal("owned after forget")
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
