package reqlock

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Backoff defaults: the interval a waiter sleeps starts at
// defaultBackoffInitial and doubles, each time randomised by ±50%, up to
// defaultBackoffMax.
const (
	defaultBackoffInitial = 5 * time.Millisecond
	defaultBackoffMax     = 200 * time.Millisecond
	backoffMultiplier     = 2
	backoffJitter         = 0.5
)

// backoffSchedule is one waiter's backoff state and timer. It is never
// shared between waiters.
type backoffSchedule struct {
	intervals backoff.ExponentialBackOff
	timer     *time.Timer
}

func newBackoffSchedule(initial, maxInterval time.Duration) *backoffSchedule {
	s := &backoffSchedule{intervals: backoff.ExponentialBackOff{
		InitialInterval:     initial,
		RandomizationFactor: backoffJitter,
		Multiplier:          backoffMultiplier,
		MaxInterval:         maxInterval,
		MaxElapsedTime:      0, // the wait limit bounds the wait, not the schedule
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}}
	s.intervals.Reset()
	return s
}

// sleep waits for the next backoff interval, cut short to limit when that
// is known and shorter (the holder's lease cannot outlast it), or until
// released signals. It returns false, with the timer stopped, when ctx ends
// first. A nil released never signals.
func (s *backoffSchedule) sleep(ctx context.Context, limit time.Duration, released <-chan struct{}) bool {
	d := s.intervals.NextBackOff()
	if limit > 0 && limit < d {
		d = limit
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

// sleepFor sleeps for d on a timer, or until ctx ends: then it reports false.
func sleepFor(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
