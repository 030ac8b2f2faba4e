package metricdefs

import (
	"sync"
	"unicode/utf8"

	"github.com/reqlock/reqlock"
)

// NumKnownOutcomes is the number of KnownOutcomes.
const NumKnownOutcomes = 7

// KnownOutcomes returns the outcomes package reqlock defines, each at its
// OutcomeIndex: reqlock.OutcomeAcquired, the only success, at index 0, then
// the failures timeout, store_error, bad_key, canceled, invalid and
// lock_lost. Their series exist for every route; an outcome beyond them,
// one a newer reqlock may add, gets a reason from Reasons.
func KnownOutcomes() [NumKnownOutcomes]reqlock.Outcome {
	return [...]reqlock.Outcome{
		reqlock.OutcomeAcquired,
		reqlock.OutcomeTimeout,
		reqlock.OutcomeStoreError,
		reqlock.OutcomeBadKey,
		reqlock.OutcomeCanceled,
		reqlock.OutcomeInvalid,
		reqlock.OutcomeLost,
	}
}

// OutcomeIndex returns the index of o in KnownOutcomes, or -1 when o is not
// one of them.
func OutcomeIndex(o reqlock.Outcome) int {
	switch o {
	case reqlock.OutcomeAcquired:
		return 0
	case reqlock.OutcomeTimeout:
		return 1
	case reqlock.OutcomeStoreError:
		return 2
	case reqlock.OutcomeBadKey:
		return 3
	case reqlock.OutcomeCanceled:
		return 4
	case reqlock.OutcomeInvalid:
		return 5
	case reqlock.OutcomeLost:
		return 6
	}
	return -1
}

// MaxOtherOutcomes caps the distinct outcomes, beyond KnownOutcomes, that
// get a reason of their own; further ones share the reason OtherReason.
const MaxOtherOutcomes = 8

// OtherReason is the reason of the outcomes beyond KnownOutcomes that get
// no reason of their own: those beyond MaxOtherOutcomes, the empty outcome
// and outcomes that are not valid UTF-8.
const OtherReason = "other"

// Reasons gives the reason labels of outcomes, one Reasons for all the
// routes of an implementation of reqlock.Metrics. Its zero value is ready
// to use; it is safe for concurrent use.
type Reasons struct {
	mu     sync.Mutex
	reason map[reqlock.Outcome]string // guarded by mu: outcomes beyond KnownOutcomes -> their reason
}

// Reason returns the reason label of o: o itself for KnownOutcomes and for
// the first MaxOtherOutcomes distinct other outcomes (valid UTF-8, not
// empty) it is given; OtherReason for the rest.
func (rs *Reasons) Reason(o reqlock.Outcome) string {
	if OutcomeIndex(o) >= 0 {
		return string(o)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if reason, ok := rs.reason[o]; ok {
		return reason
	}
	if o == "" || !utf8.ValidString(string(o)) || len(rs.reason) >= MaxOtherOutcomes {
		return OtherReason
	}
	if rs.reason == nil {
		rs.reason = make(map[reqlock.Outcome]string)
	}
	rs.reason[o] = string(o)
	return string(o)
}

// OtherOutcomes holds the series S of one route for the outcomes beyond
// KnownOutcomes, by reason. Its zero value is empty and ready to use; it is
// safe for concurrent use.
type OtherOutcomes[S any] struct {
	mu        sync.Mutex
	byOutcome map[reqlock.Outcome]*S // guarded by mu: a cache of at most MaxOtherOutcomes+1 outcomes
	byReason  map[string]*S          // guarded by mu
}

// Get returns the series of o, an outcome beyond KnownOutcomes: those of
// the reason reasons gives it, which newSeries creates on the reason's
// first outcome in this route. It does not allocate for an outcome it was
// given before.
func (oo *OtherOutcomes[S]) Get(o reqlock.Outcome, reasons *Reasons, newSeries func(reason string) *S) *S {
	oo.mu.Lock()
	defer oo.mu.Unlock()
	if s := oo.byOutcome[o]; s != nil {
		return s
	}
	reason := reasons.Reason(o) // takes reasons' lock, never held while taking oo.mu
	s := oo.byReason[reason]
	if s == nil {
		s = newSeries(reason)
		if oo.byReason == nil {
			oo.byReason = make(map[string]*S)
			oo.byOutcome = make(map[reqlock.Outcome]*S)
		}
		oo.byReason[reason] = s
	}
	if len(oo.byOutcome) < MaxOtherOutcomes+1 {
		oo.byOutcome[o] = s
	}
	return s
}

// Each calls f with each reason and its series, in no particular order.
// f must not call the methods of oo.
func (oo *OtherOutcomes[S]) Each(f func(reason string, s *S)) {
	oo.mu.Lock()
	defer oo.mu.Unlock()
	for reason, s := range oo.byReason {
		f(reason, s)
	}
}
