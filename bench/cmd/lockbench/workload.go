package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// counterTTL keeps the lost-update counters from outliving a crashed run for
// long; a finished run deletes them.
const counterTTL = time.Hour

// grant is one granted lock call: the key's index, when the call started and
// when it returned with the lock (wall clock, Unix nanoseconds, so that events
// of several processes on one machine merge).
type grant struct {
	key       int32
	start, at int64
}

// release is a holder letting go of key: the timestamp is taken right before
// it calls unlock.
type release struct {
	key int32
	at  int64
}

// spec is what one process runs: its goroutines, the keys they lock, and how
// worker w picks the key of its i-th cycle.
type spec struct {
	prefix  string // the run's key prefix, ending in ':'
	keys    int    // number of lock keys
	waiters int    // goroutines
	hold    time.Duration
	pick    func(worker, cycle int) int
}

func (s spec) lockKey(i int) string    { return s.prefix + "k" + strconv.Itoa(i) }
func (s spec) counterKey(i int) string { return s.prefix + "n" + strconv.Itoa(i) }

// hotSpec is every goroutine on key 0.
func hotSpec(prefix string, waiters int, hold time.Duration) spec {
	return spec{prefix: prefix, keys: 1, waiters: waiters, hold: hold, pick: func(int, int) int { return 0 }}
}

// spreadSpec has worker w cycle through keys w, w+workers, w+2*workers, ...
// modulo keys: when workers divides keys, no two workers ever share a key.
func spreadSpec(prefix string, keys, workers int) spec {
	return spec{prefix: prefix, keys: keys, waiters: workers, pick: func(w, i int) int {
		return (w + i*workers) % keys
	}}
}

// procResult is what one process measured. A child of the multi workload
// sends it to its parent as JSON; the exported fields are its wire format.
type procResult struct {
	GrantKey   []int32 `json:"grant_key"`
	GrantStart []int64 `json:"grant_start"`
	GrantAt    []int64 `json:"grant_at"`
	ReleaseKey []int32 `json:"release_key"`
	ReleaseAt  []int64 `json:"release_at"`

	Timeouts      int64  `json:"timeouts"`
	Errors        int64  `json:"errors"`
	ReleaseErrors int64  `json:"release_errors"`
	RMWErrors     int64  `json:"rmw_errors"`
	HarnessGets   int64  `json:"harness_gets"`
	HarnessSets   int64  `json:"harness_sets"`
	RoundTrips    int64  `json:"round_trips"`
	Handshakes    int64  `json:"handshakes"`
	CPU           int64  `json:"cpu_ns"` // the process's CPU time (user + system) in runWorkers
	FirstError    string `json:"first_error,omitempty"`
}

func (r *procResult) grants() []grant {
	g := make([]grant, len(r.GrantAt))
	for i := range g {
		g[i] = grant{key: r.GrantKey[i], start: r.GrantStart[i], at: r.GrantAt[i]}
	}
	return g
}

func (r *procResult) releases() []release {
	rel := make([]release, len(r.ReleaseAt))
	for i := range rel {
		rel[i] = release{key: r.ReleaseKey[i], at: r.ReleaseAt[i]}
	}
	return rel
}

// merge adds o into r.
func (r *procResult) merge(o *procResult) {
	r.GrantKey = append(r.GrantKey, o.GrantKey...)
	r.GrantStart = append(r.GrantStart, o.GrantStart...)
	r.GrantAt = append(r.GrantAt, o.GrantAt...)
	r.ReleaseKey = append(r.ReleaseKey, o.ReleaseKey...)
	r.ReleaseAt = append(r.ReleaseAt, o.ReleaseAt...)
	r.Timeouts += o.Timeouts
	r.Errors += o.Errors
	r.ReleaseErrors += o.ReleaseErrors
	r.RMWErrors += o.RMWErrors
	r.HarnessGets += o.HarnessGets
	r.HarnessSets += o.HarnessSets
	r.RoundTrips += o.RoundTrips
	r.Handshakes += o.Handshakes
	r.CPU += o.CPU
	if r.FirstError == "" {
		r.FirstError = o.FirstError
	}
}

// runWorkers runs s's goroutines from start until deadline: each loops
// lock, increment the key's counter non-atomically, hold, unlock. A goroutine
// starts no lock call at or after deadline, but a call in flight then runs to
// its grant or its wait limit (and the grant is used and released as usual),
// so every goroutine ends by deadline + wait + hold plus a release. It returns
// when all have ended, or when ctx ends (then sooner).
func runWorkers(ctx context.Context, lk locker, harness *redis.Client, s spec, wait time.Duration,
	start, deadline time.Time) *procResult {
	cpuBefore := processCPU()
	results := make([]procResult, s.waiters)
	var wg sync.WaitGroup
	for w := range s.waiters {
		wg.Go(func() {
			worker(ctx, lk, harness, s, w, wait, start, deadline, &results[w])
		})
	}
	wg.Wait()
	total := &procResult{CPU: int64(processCPU() - cpuBefore)}
	for i := range results {
		total.merge(&results[i])
	}
	return total
}

func worker(ctx context.Context, lk locker, harness *redis.Client, s spec, w int, wait time.Duration,
	start, deadline time.Time, res *procResult) {
	if !sleepUntil(ctx, start) {
		return
	}
	noteError := func(err error) {
		if res.FirstError == "" {
			res.FirstError = err.Error()
		}
	}
	for cycle := 0; ctx.Err() == nil && time.Now().Before(deadline); cycle++ {
		k := s.pick(w, cycle)
		key := s.lockKey(k)
		lctx, cancel := context.WithTimeout(ctx, wait)
		t0 := time.Now()
		unlock, err := lk.lock(lctx, key)
		t1 := time.Now()
		cancel()
		if err != nil {
			if errors.Is(err, errTimeout) {
				res.Timeouts++
			} else {
				res.Errors++
				noteError(err)
				// Do not spin on a failing store; the deadline still ends the loop.
				sleepUntil(ctx, time.Now().Add(time.Millisecond))
			}
			continue
		}
		res.GrantKey = append(res.GrantKey, int32(k))
		res.GrantStart = append(res.GrantStart, t0.UnixNano())
		res.GrantAt = append(res.GrantAt, t1.UnixNano())

		if err := increment(harness, s.counterKey(k), res); err != nil {
			res.RMWErrors++
			noteError(err)
		}
		if s.hold > 0 {
			time.Sleep(s.hold)
		}
		res.ReleaseKey = append(res.ReleaseKey, int32(k))
		res.ReleaseAt = append(res.ReleaseAt, time.Now().UnixNano())
		if err := unlock(); err != nil {
			res.ReleaseErrors++
			noteError(err)
		}
	}
}

// increment adds 1 to the counter at key the wrong way on purpose: GET, then
// SET, two commands with nothing making them atomic. Only the lock keeps two
// holders from interleaving them; an increment lost to such an interleaving
// shows as a counter below the number of grants.
func increment(c *redis.Client, key string, res *procResult) error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	res.HarnessGets++
	n, err := c.Get(ctx, key).Int64()
	if errors.Is(err, redis.Nil) {
		n, err = 0, nil
	}
	if err != nil {
		return err
	}
	res.HarnessSets++
	return c.Set(ctx, key, n+1, counterTTL).Err()
}

// sleepUntil sleeps until t or until ctx ends, and reports whether ctx is
// still alive.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
