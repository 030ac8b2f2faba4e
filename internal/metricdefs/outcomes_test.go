package metricdefs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/reqlock/reqlock"
)

func TestKnownOutcomes(t *testing.T) {
	known := KnownOutcomes()
	want := []reqlock.Outcome{
		reqlock.OutcomeAcquired, reqlock.OutcomeTimeout, reqlock.OutcomeStoreError, reqlock.OutcomeBadKey,
		reqlock.OutcomeCanceled, reqlock.OutcomeInvalid, reqlock.OutcomeLost,
	}
	if !slices.Equal(known[:], want) {
		t.Errorf("KnownOutcomes() = %q, want %q", known, want)
	}
	for i, o := range known {
		if got := OutcomeIndex(o); got != i {
			t.Errorf("OutcomeIndex(%q) = %d, want %d", o, got, i)
		}
	}
	for _, o := range []reqlock.Outcome{"", "quorum", "Acquired", "lost", OtherReason} {
		if got := OutcomeIndex(o); got != -1 {
			t.Errorf("OutcomeIndex(%q) = %d, want -1", o, got)
		}
	}
}

// TestOutcomeOfIsKnown: every outcome reqlock.OutcomeOf gives has series of
// its own from a route's first event, rather than a reason of the kind a
// newer reqlock may add.
func TestOutcomeOfIsKnown(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(live)
	cancel()
	for _, c := range []struct {
		ctx  context.Context
		err  error
		want reqlock.Outcome
	}{
		{live, nil, reqlock.OutcomeAcquired},
		{live, reqlock.ErrHeld, reqlock.OutcomeTimeout},
		{ended, errors.Join(reqlock.ErrWaitEnded, context.DeadlineExceeded), reqlock.OutcomeTimeout},
		{live, errors.Join(reqlock.ErrWaitEnded, context.DeadlineExceeded), reqlock.OutcomeStoreError},
		{live, reqlock.ErrStore, reqlock.OutcomeStoreError},
		{ended, errors.Join(reqlock.ErrWaitEnded, context.Canceled), reqlock.OutcomeCanceled},
		{live, fmt.Errorf("%w: keys in different slots", reqlock.ErrInvalid), reqlock.OutcomeInvalid},
		{live, errors.Join(reqlock.ErrLockLost, reqlock.ErrNotHeld), reqlock.OutcomeLost},
		{live, errors.New("unforeseen"), reqlock.OutcomeInvalid},
	} {
		got := reqlock.OutcomeOf(c.ctx, c.err)
		if got != c.want || OutcomeIndex(got) < 0 {
			t.Errorf("OutcomeOf(%v) = %q (index %d), want the known %q", c.err, got, OutcomeIndex(got), c.want)
		}
	}
}

// TestHelp: the HELP of lock_failure_total explains every reason, and that
// of lock_lost_total both ways a lock is found lost.
func TestHelp(t *testing.T) {
	known := KnownOutcomes()
	for _, o := range known[1:] {
		if !strings.Contains(HelpFailure, " "+string(o)+" (") {
			t.Errorf("HelpFailure does not explain the reason %s", o)
		}
	}
	// lock_lost_total counts every loss found while a lock is held.
	if !strings.Contains(HelpLost, "validity ran out without a renewal") || !strings.Contains(HelpLost, "a renewal found them gone") {
		t.Errorf("HelpLost does not name both ways a lock is found lost: %s", HelpLost)
	}
}

func TestReasons(t *testing.T) {
	var rs Reasons // the zero value is ready
	for _, o := range KnownOutcomes() {
		if got := rs.Reason(o); got != string(o) {
			t.Errorf("Reason(%q) = %q", o, got)
		}
	}
	for _, o := range []reqlock.Outcome{"", "bad\xff"} {
		if got := rs.Reason(o); got != OtherReason {
			t.Errorf("Reason(%q) = %q, want %q", o, got, OtherReason)
		}
	}
	for i := range MaxOtherOutcomes + 2 {
		o := reqlock.Outcome(fmt.Sprintf("new%d", i))
		want := string(o)
		if i >= MaxOtherOutcomes {
			want = OtherReason
		}
		for range 2 { // the same reason the second time
			if got := rs.Reason(o); got != want {
				t.Errorf("Reason(%q) = %q, want %q", o, got, want)
			}
		}
	}
	// Known outcomes take none of the slots, and keep their reason.
	for _, o := range []reqlock.Outcome{reqlock.OutcomeTimeout, reqlock.OutcomeInvalid, reqlock.OutcomeLost} {
		if got := rs.Reason(o); got != string(o) {
			t.Errorf("Reason(%q) after the cap = %q", o, got)
		}
	}
}

func TestOtherOutcomes(t *testing.T) {
	var rs Reasons
	var oo OtherOutcomes[int]
	var created []string
	newSeries := func(reason string) *int {
		created = append(created, reason)
		return new(int)
	}
	quorum := oo.Get("quorum", &rs, newSeries)
	if oo.Get("quorum", &rs, newSeries) != quorum {
		t.Error("a second Get of an outcome gives other series")
	}
	empty := oo.Get("", &rs, newSeries)
	if oo.Get("bad\xff", &rs, newSeries) != empty {
		t.Error("outcomes of the reason other do not share their series")
	}
	if !slices.Equal(created, []string{"quorum", OtherReason}) {
		t.Errorf("created %q", created)
	}
	got := make(map[string]*int)
	oo.Each(func(reason string, s *int) { got[reason] = s })
	if len(got) != 2 || got["quorum"] != quorum || got[OtherReason] != empty {
		t.Errorf("Each: %v", got)
	}
}
