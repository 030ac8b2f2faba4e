package reqlock

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Backoff configures how a waiter spaces its attempts: exponential growth
// from Initial up to Max, each interval randomised by ±Jitter.
// The zero value of a field takes its value from DefaultBackoff.
type Backoff struct {
	// Initial is the first interval. Default 5ms.
	Initial time.Duration
	// Max caps the interval before jitter. Default 200ms.
	Max time.Duration
	// Multiplier grows the interval after each attempt. Default 2.
	Multiplier float64
	// Jitter is the randomisation factor in [0, 1). Default 0.5.
	Jitter float64
}

// DefaultBackoff is the backoff a Locker uses unless WithBackoff says otherwise.
var DefaultBackoff = Backoff{
	Initial:    5 * time.Millisecond,
	Max:        200 * time.Millisecond,
	Multiplier: 2,
	Jitter:     0.5,
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max == 0 {
		b.Max = DefaultBackoff.Max
	}
	if b.Multiplier == 0 {
		b.Multiplier = DefaultBackoff.Multiplier
	}
	if b.Jitter == 0 {
		b.Jitter = DefaultBackoff.Jitter
	}
	return b
}

func (b Backoff) validate() error {
	switch {
	case b.Initial < 0:
		return fmt.Errorf("%w: backoff initial interval %v is negative", ErrInvalid, b.Initial)
	case b.Max < b.Initial:
		return fmt.Errorf("%w: backoff max interval %v is below the initial interval %v", ErrInvalid, b.Max, b.Initial)
	case b.Multiplier < 1:
		return fmt.Errorf("%w: backoff multiplier %v is below 1", ErrInvalid, b.Multiplier)
	case b.Jitter < 0 || b.Jitter >= 1:
		return fmt.Errorf("%w: backoff jitter %v is outside [0, 1)", ErrInvalid, b.Jitter)
	}
	return nil
}

// newSchedule returns backoff state for one waiter. It is never shared
// between waiters.
func (b Backoff) newSchedule() *backoff.ExponentialBackOff {
	s := &backoff.ExponentialBackOff{
		InitialInterval:     b.Initial,
		RandomizationFactor: b.Jitter,
		Multiplier:          b.Multiplier,
		MaxInterval:         b.Max,
		MaxElapsedTime:      0, // the wait limit bounds the wait, not the schedule
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	s.Reset()
	return s
}

// backoffSchedule is one waiter's backoff state and timer.
type backoffSchedule struct {
	intervals *backoff.ExponentialBackOff
	timer     *time.Timer
}

func newBackoffSchedule(b Backoff) *backoffSchedule {
	return &backoffSchedule{intervals: b.newSchedule()}
}

// sleep waits for the next backoff interval, cut short to holderTTL when
// that is known and shorter (the holder's lease cannot outlast it), or until
// released signals. It returns false, with the timer stopped, when ctx ends
// first. A nil released never signals.
func (s *backoffSchedule) sleep(ctx context.Context, holderTTL time.Duration, released <-chan struct{}) bool {
	d := s.intervals.NextBackOff()
	if holderTTL > 0 && holderTTL < d {
		d = holderTTL
	}
	if s.timer == nil {
		s.timer = time.NewTimer(d)
	} else {
		s.timer.Reset(d)
	}
	select {
	case <-ctx.Done():
		s.timer.Stop()
		return false
	case <-released:
		s.timer.Stop()
		return true
	case <-s.timer.C:
		return true
	}
}
