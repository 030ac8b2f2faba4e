package reqlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// fairProc is one "process" of the fair tests: a Locker over a store over a
// client of its own, so that it shares no local queue, pub/sub connection or
// connection pool with the others.
type fairProc struct {
	locker   *reqlock.Locker
	store    *redisstore.Store
	fair     bool
	answered chan struct{} // each fair attempt the store answered, when there is room
	close    func()
}

// answeringStore is a Redis store that tells of each fair attempt it
// answered.
type answeringStore struct {
	*redisstore.Store
	answered chan struct{}
}

func (s answeringStore) AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	g, err := s.Store.AcquireFair(ctx, key, token, ttl, lease)
	if err == nil {
		select {
		case s.answered <- struct{}{}:
		default:
		}
	}
	return g, err
}

// defaultLease is the lease of the fair tests that do not test the lease.
const defaultLease = 2 * time.Second

// newFairProc returns a process of its own on the test Redis, fair unless
// fair is false, with lease (defaultLease when zero) and opts.
func newFairProc(t *testing.T, prefix string, fair bool, lease time.Duration, opts ...reqlock.Option) *fairProc {
	t.Helper()
	client := testredis.Client(t)
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]reqlock.Option{reqlock.WithKeyPrefix(prefix)}, opts...)
	if fair {
		if lease == 0 {
			lease = defaultLease
		}
		opts = append(opts, reqlock.WithFairness(lease))
	}
	answered := make(chan struct{}, 1<<10)
	l, err := reqlock.New(answeringStore{store, answered}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	p := &fairProc{locker: l, store: store, fair: fair, answered: answered, close: func() {
		once.Do(func() {
			_ = store.Close()
			_ = client.Close()
		})
	}}
	t.Cleanup(p.close)
	return p
}

// fairQueueKey and fairLeaseKey name a store key's fair sets as redisstore
// does for keys without braces (testredis prefixes have none).
func fairQueueKey(storeKey string) string { return "{" + storeKey + "}:fair:queue" }
func fairLeaseKey(storeKey string) string { return "{" + storeKey + "}:fair:lease" }

// fairObserver reads the fair sets of a key behind the Lockers' backs.
type fairObserver struct {
	t        *testing.T
	storeKey string
	zrange   func(key string) ([]string, error)
}

func newFairObserver(t *testing.T, storeKey string) *fairObserver {
	client := testredis.Client(t)
	return &fairObserver{t: t, storeKey: storeKey, zrange: func(key string) ([]string, error) {
		return client.ZRange(context.Background(), key, 0, -1).Result()
	}}
}

// queue returns the queued tokens, head first.
func (o *fairObserver) queue() []string {
	o.t.Helper()
	q, err := o.zrange(fairQueueKey(o.storeKey))
	if err != nil {
		o.t.Fatal(err)
	}
	return q
}

// absent fails the test when token is still in the queue or the lease set.
func (o *fairObserver) absent(token string) {
	o.t.Helper()
	for _, k := range []string{fairQueueKey(o.storeKey), fairLeaseKey(o.storeKey)} {
		members, err := o.zrange(k)
		if err != nil {
			o.t.Fatal(err)
		}
		if slices.Contains(members, token) {
			o.t.Fatalf("token %q is still in %s: %v", token, k, members)
		}
	}
}

// waitQueueLen polls until the queue holds n tokens and returns them.
func (o *fairObserver) waitQueueLen(n int) []string {
	o.t.Helper()
	var q []string
	eventually(o.t, fmt.Sprintf("%d waiters in the fair queue", n), func() bool {
		q = o.queue()
		return len(q) == n
	})
	return q
}

// fairBaseline returns the goroutine count to come back to: taken after
// testredis has started its server, whose goroutines live until TestMain ends.
func fairBaseline(t *testing.T) int {
	testredis.Addr(t)
	return runtime.NumGoroutine()
}

func TestFairFIFOAcrossProcesses(t *testing.T) {
	base := fairBaseline(t)
	prefix := testredis.Prefix(t)
	ctx := context.Background()
	const n = 4
	holder := newFairProc(t, prefix, true, 0)
	procs := make([]*fairProc, n)
	for i := range procs {
		procs[i] = newFairProc(t, prefix, true, 0)
	}
	obs := newFairObserver(t, prefix+"k")

	held, err := holder.locker.Obtain(ctx, "k", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i, p := range procs {
		wg.Go(func() {
			lock, err := p.locker.Obtain(ctx, "k", 10*time.Second, 20*time.Second)
			if err != nil {
				t.Errorf("process %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i) // under the lock: grant order
			mu.Unlock()
			if err := lock.Release(ctx); err != nil {
				t.Errorf("process %d: release: %v", i, err)
			}
		})
		obs.waitQueueLen(i + 1) // process i has joined before i+1 starts
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if want := []int{0, 1, 2, 3}; !slices.Equal(order, want) {
		t.Fatalf("grant order %v, want the queue order %v", order, want)
	}
	if q := obs.queue(); len(q) != 0 {
		t.Fatalf("queue left: %v", q)
	}
	holder.close()
	for _, p := range procs {
		p.close()
	}
	goroutinesBackTo(t, base)
}

// Environment of TestFairHelperProcess.
const (
	envFairHelper = "REQLOCK_TEST_FAIR_HELPER"
	envFairPrefix = "REQLOCK_TEST_FAIR_PREFIX"
	envFairLease  = "REQLOCK_TEST_FAIR_LEASE"
)

// TestFairHelperProcess is not a test: TestFairKilledWaiterProcess runs the
// test binary again with only this function and envFairHelper set, as a
// separate process that waits fairly for key "k" until it is killed.
func TestFairHelperProcess(t *testing.T) {
	if os.Getenv(envFairHelper) != "1" {
		return
	}
	lease, err := time.ParseDuration(os.Getenv(envFairLease))
	if err != nil {
		t.Fatal(err)
	}
	p := newFairProc(t, os.Getenv(envFairPrefix), true, lease)
	// The parent kills this process long before the wait ends; should
	// the parent die first, the wait ends and so does this process.
	lock, err := p.locker.Obtain(context.Background(), "k", 10*time.Second, 30*time.Second)
	fmt.Printf("helper: Obtain returned %v, %v\n", lock != nil, err)
}

// TestFairKilledWaiterProcess: a waiter process killed with SIGKILL while at
// the head of the fair queue blocks the key no longer than its lease plus a
// poll interval; then the next waiter gets it and the dead token is gone.
func TestFairKilledWaiterProcess(t *testing.T) {
	const lease = 600 * time.Millisecond
	base := fairBaseline(t)
	prefix := testredis.Prefix(t)
	ctx := context.Background()
	holder := newFairProc(t, prefix, true, lease)
	waiter := newFairProc(t, prefix, true, lease)
	obs := newFairObserver(t, prefix+"k")

	held, err := holder.locker.Obtain(ctx, "k", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestFairHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envFairHelper+"=1", envFairPrefix+"="+prefix, envFairLease+"="+lease.String(),
		testredis.EnvAddr+"="+testredis.Addr(t))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	dead := obs.waitQueueLen(1)[0]

	res := obtainAllAsync(ctx, waiter.locker, []string{"k"}, 10*time.Second, 20*time.Second)
	if q := obs.waitQueueLen(2); q[0] != dead {
		t.Fatalf("queue %v: the helper process %q is not at the head", q, dead)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no LeaveFair, no cleanup
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Logf("helper process ended: %v", waitErr)
	case <-time.After(10 * time.Second):
		t.Fatal("the helper process did not die")
	}
	killed := time.Now()
	if q := obs.queue(); len(q) == 0 || q[0] != dead {
		t.Fatalf("queue %v right after the kill: the dead waiter should still head it", q)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()

	var r obtained
	select {
	case r = <-res:
	case <-time.After(2*lease + 10*time.Second):
		t.Fatalf("the waiter behind the dead one was not granted; helper output:\n%s", out.String())
	}
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	afterKill, afterRelease := r.at.Sub(killed), r.at.Sub(released)
	t.Logf("granted %v after the kill, %v after the release (lease %v)", afterKill, afterRelease, lease)
	if limit := 2*lease + time.Second; afterRelease > limit {
		t.Fatalf("granted %v after the release, want at most %v", afterRelease, limit)
	}
	// The dead waiter had renewed its lease at most lease/3 before it was
	// killed: a grant sooner than that means the queue was skipped.
	if afterKill < lease/2 {
		t.Fatalf("granted %v after the kill: the dead head's lease (%v) was not respected", afterKill, lease)
	}
	obs.absent(dead)
	if err := r.lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if q := obs.queue(); len(q) != 0 {
		t.Fatalf("queue left: %v", q)
	}
	holder.close()
	waiter.close()
	goroutinesBackTo(t, base)
}

func TestFairWaiterWhoseWaitEndsLeavesTheQueue(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wait    time.Duration
		cancel  bool
		wantErr error
	}{
		{"cancelled", 20 * time.Second, true, context.Canceled},
		{"wait limit", 300 * time.Millisecond, false, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := fairBaseline(t)
			prefix := testredis.Prefix(t)
			holder := newFairProc(t, prefix, true, 0)
			// Between attempts the waiter sleeps lease/3, so that its wait
			// ends while it sleeps, not while an attempt is unanswered
			// (then it leaves the queue in the background).
			waiter := newFairProc(t, prefix, true, 0, reqlock.WithBackoff(time.Minute, time.Minute))
			obs := newFairObserver(t, prefix+"k")
			held, err := holder.locker.Obtain(context.Background(), "k", 10*time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			res := obtainAllAsync(ctx, waiter.locker, []string{"k"}, 10*time.Second, tc.wait)
			token := obs.waitQueueLen(1)[0]
			for range 2 { // joined the queue, subscribed, tried again: now it sleeps
				within(t, waiter.answered, 5*time.Second, "the waiter's attempts were not answered")
			}
			if tc.cancel {
				cancel()
			}
			r := <-res
			if r.lock != nil || !errors.Is(r.err, reqlock.ErrWaitEnded) || !errors.Is(r.err, reqlock.ErrHeld) ||
				!errors.Is(r.err, tc.wantErr) {
				t.Fatalf("Obtain: %v, want ErrWaitEnded, ErrHeld and %v", r.err, tc.wantErr)
			}
			obs.absent(token) // at once: Obtain left the queue before returning
			if n := reqlock.LocalQueues(waiter.locker); n != 0 {
				t.Fatalf("%d local queues left", n)
			}
			if err := held.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			holder.close()
			waiter.close()
			goroutinesBackTo(t, base)
		})
	}
}

// TestFairFencesIncreaseAcrossFairAndPlainGrants: fair Lockers and a plain
// one (with local handoff) share a key; every grant's fence exceeds the
// previous one, and no two holders overlap.
func TestFairFencesIncreaseAcrossFairAndPlainGrants(t *testing.T) {
	base := fairBaseline(t)
	prefix := testredis.Prefix(t)
	procs := []*fairProc{
		newFairProc(t, prefix, true, 0),
		newFairProc(t, prefix, true, 0),
		newFairProc(t, prefix, false, 0),
	}
	const perProc, cycles = 3, 8
	var (
		mu       sync.Mutex
		fences   []int64
		fairOnes atomic.Int32
		inside   atomic.Int32
		wg       sync.WaitGroup
	)
	for _, p := range procs {
		for range perProc {
			wg.Go(func() {
				for range cycles {
					lock, err := p.locker.Obtain(context.Background(), "k", 10*time.Second, 20*time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					if inside.Add(1) != 1 {
						t.Error("two holders at once")
					}
					mu.Lock()
					fences = append(fences, lock.Fence())
					mu.Unlock()
					if p.fair {
						fairOnes.Add(1)
					}
					inside.Add(-1)
					if err := lock.Release(context.Background()); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if len(fences) != len(procs)*perProc*cycles || fairOnes.Load() == 0 {
		t.Fatalf("%d grants (%d fair)", len(fences), fairOnes.Load())
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("grant %d has fence %d after %d", i, fences[i], fences[i-1])
		}
	}
	for _, p := range procs {
		p.close()
	}
	goroutinesBackTo(t, base)
}

// TestFairProcessesTakeTurns: two Lockers on one store are two processes.
// Each process's local queue feeds the store's queue one contender at a
// time, and there is no local handoff, so under contention the processes
// alternate (a1 came before b1 but waited locally behind a's holder).
func TestFairProcessesTakeTurns(t *testing.T) {
	store := memstore.New()
	fair := reqlock.WithFairness(defaultLease)
	a, b := reqlock.MustNew(store, fair), reqlock.MustNew(store, fair)
	ctx := context.Background()
	const storeKey = "reqlock:k"
	held, err := a.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		order  []string
		tokens = map[string]bool{held.Token(): true}
		wg     sync.WaitGroup
	)
	start := func(l *reqlock.Locker, name string) {
		wg.Go(func() {
			lock, err := l.Obtain(ctx, "k", time.Minute, 20*time.Second)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			mu.Lock()
			order = append(order, name)
			if tokens[lock.Token()] {
				t.Errorf("%s got a token granted before: a local handoff", name)
			}
			tokens[lock.Token()] = true
			last := len(order) == 4
			mu.Unlock()
			// A process's next contender joins the store's queue only
			// when its previous holder has let go. Hold until the other
			// process's contender has joined, so the order does not
			// depend on how fast goroutines are scheduled.
			deadline := time.Now().Add(5 * time.Second)
			for !last && len(store.FairWaiters(storeKey)) == 0 {
				if time.Now().After(deadline) {
					t.Errorf("%s: nobody joined the store's queue", name)
					break
				}
				<-time.After(time.Millisecond) // poll interval inside a deadline
			}
			_ = lock.Release(ctx)
		})
	}
	start(a, "a1")
	eventually(t, "a1 queued locally", func() bool { return reqlock.LocalWaiters(a, storeKey) == 1 })
	start(b, "b1")
	eventually(t, "b1 joined the store's queue", func() bool { return len(store.FairWaiters(storeKey)) == 1 })
	start(a, "a2")
	eventually(t, "a2 queued locally", func() bool { return reqlock.LocalWaiters(a, storeKey) == 2 })
	start(b, "b2")
	eventually(t, "b2 queued locally", func() bool { return reqlock.LocalWaiters(b, storeKey) == 1 })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if want := []string{"b1", "a1", "b2", "a2"}; !slices.Equal(order, want) {
		t.Fatalf("grant order %v, want %v", order, want)
	}
	if q := store.FairWaiters(storeKey); len(q) != 0 {
		t.Fatalf("store queue left: %v", q)
	}
}

// TestFairTryOnceDoesNotQueue: a try-once Obtain neither joins the store's
// queue nor passes a waiter in it.
func TestFairTryOnceDoesNotQueue(t *testing.T) {
	store := memstore.New()
	fair := reqlock.WithFairness(defaultLease)
	a, b, c := reqlock.MustNew(store, fair), reqlock.MustNew(store, fair), reqlock.MustNew(store, fair)
	ctx := context.Background()
	const storeKey = "reqlock:k"
	held, err := a.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Obtain(ctx, "k", time.Minute, 0); !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("try once on a held key: %v", err)
	}
	if q := store.FairWaiters(storeKey); len(q) != 0 {
		t.Fatalf("a try joined the queue: %v", q)
	}
	res := obtainAllAsync(ctx, c, []string{"k"}, time.Minute, 20*time.Second)
	eventually(t, "c joined the store's queue", func() bool { return len(store.FairWaiters(storeKey)) == 1 })
	// Release while c waits: the key is free, but c heads the queue. A try
	// that comes first still must not take it.
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if lock, err := b.Obtain(ctx, "k", time.Minute, 0); err == nil {
		// Only possible when c was granted before this try.
		_ = lock.Release(ctx)
		if len(store.FairWaiters(storeKey)) != 0 {
			t.Fatal("a try passed a queued waiter")
		}
	} else if !errors.Is(err, reqlock.ErrHeld) {
		t.Fatalf("try once behind a queued waiter: %v", err)
	}
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.lock.Release(ctx)
}

// notFair is a store without stores.FairStore.
type notFair struct{ stores.Store }

func TestFairInvalidConfiguration(t *testing.T) {
	const minLease = 30 * time.Millisecond
	for _, tc := range []struct {
		name  string
		store stores.Store
		lease time.Duration
	}{
		{"store without FairStore", notFair{memstore.New()}, defaultLease},
		{"lease below the minimum", memstore.New(), minLease - time.Millisecond},
		{"zero lease", memstore.New(), 0},
		{"negative lease", memstore.New(), -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reqlock.New(tc.store, reqlock.WithFairness(tc.lease))
			if !errors.Is(err, reqlock.ErrInvalid) || !strings.Contains(err.Error(), "WithFairness") {
				t.Fatalf("New: %v, want ErrInvalid naming WithFairness", err)
			}
		})
	}
	if _, err := reqlock.New(memstore.New(), reqlock.WithFairness(minLease)); err != nil {
		t.Fatalf("minimum lease: %v", err)
	}
}

// TestFairPollsWithinALeaseThird: with a backoff far longer than the lease,
// a fair waiter still renews its lease in time and keeps its place.
func TestFairPollsWithinALeaseThird(t *testing.T) {
	store := memstore.New()
	slow := reqlock.WithBackoff(5*time.Second, 5*time.Second)
	lease := reqlock.WithFairness(150 * time.Millisecond)
	a, b := reqlock.MustNew(store, lease), reqlock.MustNew(store, lease, slow)
	c := reqlock.MustNew(store, reqlock.WithFairness(time.Minute))
	ctx := context.Background()
	const storeKey = "reqlock:k"
	held, err := a.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	resB := obtainAllAsync(ctx, b, []string{"k"}, time.Minute, 20*time.Second)
	eventually(t, "b joined the store's queue", func() bool { return len(store.FairWaiters(storeKey)) == 1 })
	resC := obtainAllAsync(ctx, c, []string{"k"}, time.Minute, 20*time.Second)
	eventually(t, "c joined the store's queue", func() bool { return len(store.FairWaiters(storeKey)) == 2 })
	first := store.FairWaiters(storeKey)[0]
	// Five of b's leases pass while the key is held. c attempts every
	// 300ms at most (its backoff, 200ms ±50%) and would drop b, had b not
	// renewed.
	end := time.Now().Add(750 * time.Millisecond)
	for time.Now().Before(end) {
		if q := store.FairWaiters(storeKey); len(q) != 2 || q[0] != first {
			t.Fatalf("b lost its place: queue %v", q)
		}
		time.Sleep(10 * time.Millisecond) // sampling interval of a bounded check
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rb := <-resB
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	select {
	case <-resC:
		t.Fatal("c was granted while b held the key")
	default:
	}
	_ = rb.lock.Release(ctx)
	rc := <-resC
	if rc.err != nil {
		t.Fatal(rc.err)
	}
	_ = rc.lock.Release(ctx)
}

// fairSpy records the refused AcquireFair calls that reach a memstore.
type fairSpy struct {
	*memstore.Store
	mu    sync.Mutex
	calls []fairCall
	subs  atomic.Int32
}

type fairCall struct {
	token string
	at    time.Time
	ahead int
}

func (s *fairSpy) AcquireFair(ctx context.Context, key, token string, ttl, lease time.Duration) (stores.FairGrant, error) {
	g, err := s.Store.AcquireFair(ctx, key, token, ttl, lease)
	if err == nil && !g.OK {
		s.mu.Lock()
		s.calls = append(s.calls, fairCall{token, time.Now(), g.Ahead})
		s.mu.Unlock()
	}
	return g, err
}

func (s *fairSpy) NotifyRelease(key, token string) (<-chan struct{}, func()) {
	s.subs.Add(1)
	return s.Store.NotifyRelease(key, token)
}

// callsOf returns the calls of token, or of the first caller when token is
// empty, and that caller's token.
func (s *fairSpy) callsOf(token string) ([]fairCall, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []fairCall
	for _, c := range s.calls {
		if token == "" {
			token = c.token
		}
		if c.token == token {
			out = append(out, c)
		}
	}
	return out, token
}

// TestFairOnlyTheHeadRetriesAfterSubscribing: after its first refusal a
// waiter subscribes to releases, and then only the head of the store's
// queue tries again at once (a release it missed meanwhile was its turn);
// a waiter further back waits for a signal.
func TestFairOnlyTheHeadRetriesAfterSubscribing(t *testing.T) {
	spy := &fairSpy{Store: memstore.New()}
	opts := []reqlock.Option{
		reqlock.WithFairness(30 * time.Second),
		reqlock.WithBackoff(time.Hour, time.Hour), // no timer wake-ups here
	}
	holder, head, second := reqlock.MustNew(spy, opts...), reqlock.MustNew(spy, opts...), reqlock.MustNew(spy, opts...)
	ctx := context.Background()
	held, err := holder.Obtain(ctx, "k", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	resHead := obtainAllAsync(ctx, head, []string{"k"}, time.Minute, 20*time.Second)
	var headToken string
	eventually(t, "the head joined, subscribed and tried again", func() bool {
		var calls []fairCall
		calls, headToken = spy.callsOf("")
		return len(calls) == 2 // joined, subscribed, tried again
	})
	resSecond := obtainAllAsync(ctx, second, []string{"k"}, time.Minute, 20*time.Second)
	eventually(t, "the second waiter subscribed", func() bool { return spy.subs.Load() == 2 }) // second has joined and subscribed
	releasedAt := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []<-chan obtained{resHead, resSecond} {
		o := <-r
		if o.err != nil {
			t.Fatal(o.err)
		}
		_ = o.lock.Release(ctx)
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	var before int
	for _, c := range spy.calls {
		if c.token != headToken && c.at.Before(releasedAt) {
			before++
			if c.ahead != 1 {
				t.Errorf("second waiter: %d ahead, want 1", c.ahead)
			}
		}
	}
	if before != 1 {
		t.Fatalf("the second waiter called the store %d times before the release, want 1 (no retry after subscribing)", before)
	}
}
