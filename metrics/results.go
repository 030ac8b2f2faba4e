package metrics

import (
	"sync"
	"unicode/utf8"

	"github.com/reqlock/reqlock"
)

// NumKnownResults is the number of KnownResults.
const NumKnownResults = 5

// KnownResults returns the results package reqlock defines, each at its
// ResultIndex: reqlock.ResultAcquired, the only success, at index 0, then
// the failures timeout, store_error, bad_key and canceled. Their series
// exist for every route; a result beyond them, one a newer reqlock may
// add, gets a reason from Reasons.
func KnownResults() [NumKnownResults]reqlock.Result {
	return [...]reqlock.Result{
		reqlock.ResultAcquired,
		reqlock.ResultTimeout,
		reqlock.ResultStoreError,
		reqlock.ResultBadKey,
		reqlock.ResultCanceled,
	}
}

// ResultIndex returns the index of r in KnownResults, or -1 when r is not
// one of them.
func ResultIndex(r reqlock.Result) int {
	switch r {
	case reqlock.ResultAcquired:
		return 0
	case reqlock.ResultTimeout:
		return 1
	case reqlock.ResultStoreError:
		return 2
	case reqlock.ResultBadKey:
		return 3
	case reqlock.ResultCanceled:
		return 4
	}
	return -1
}

// MaxOtherResults caps the distinct results, beyond KnownResults, that get
// a reason of their own; further ones share the reason OtherReason.
const MaxOtherResults = 8

// OtherReason is the reason of the results beyond KnownResults that get no
// reason of their own: those beyond MaxOtherResults, the empty result and
// results that are not valid UTF-8.
const OtherReason = "other"

// Reasons gives the reason labels of results, for an implementation of
// reqlock.Metrics, one Reasons for all its routes. Its zero value is ready
// to use; it is safe for concurrent use.
type Reasons struct {
	mu     sync.Mutex
	reason map[reqlock.Result]string // guarded by mu: results beyond KnownResults -> their reason
}

// Reason returns the reason label of result: the result itself for
// KnownResults and for the first MaxOtherResults distinct other results
// (valid UTF-8, not empty) it is given; OtherReason for the rest.
func (rs *Reasons) Reason(result reqlock.Result) string {
	if ResultIndex(result) >= 0 {
		return string(result)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if reason, ok := rs.reason[result]; ok {
		return reason
	}
	if result == "" || !utf8.ValidString(string(result)) || len(rs.reason) >= MaxOtherResults {
		return OtherReason
	}
	if rs.reason == nil {
		rs.reason = make(map[reqlock.Result]string)
	}
	rs.reason[result] = string(result)
	return string(result)
}

// OtherResults holds the series S of one route for the results beyond
// KnownResults, by reason, for an implementation of reqlock.Metrics. Its
// zero value is empty and ready to use; it is safe for concurrent use.
type OtherResults[S any] struct {
	mu       sync.Mutex
	byResult map[reqlock.Result]*S // guarded by mu: a cache of at most MaxOtherResults+1 results
	byReason map[string]*S         // guarded by mu
}

// Get returns the series of result, a result beyond KnownResults: those of
// the reason reasons gives it, which newSeries creates on the reason's
// first result in this route. It does not allocate for a result it was
// given before.
func (o *OtherResults[S]) Get(result reqlock.Result, reasons *Reasons, newSeries func(reason string) *S) *S {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s := o.byResult[result]; s != nil {
		return s
	}
	reason := reasons.Reason(result) // takes reasons' lock, never held while taking o.mu
	s := o.byReason[reason]
	if s == nil {
		s = newSeries(reason)
		if o.byReason == nil {
			o.byReason = make(map[string]*S)
			o.byResult = make(map[reqlock.Result]*S)
		}
		o.byReason[reason] = s
	}
	if len(o.byResult) < MaxOtherResults+1 {
		o.byResult[result] = s
	}
	return s
}

// Each calls f with each reason and its series, in no particular order.
// f must not call the methods of o.
func (o *OtherResults[S]) Each(f func(reason string, s *S)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for reason, s := range o.byReason {
		f(reason, s)
	}
}
