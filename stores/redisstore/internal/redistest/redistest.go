// Package redistest holds the test wiring that redisstore and its drivers'
// tests share: fault proxies in front of every node of a topology, and the
// failover of a Sentinel set or a Redis Cluster under load.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// ProxiedDialer returns a go-redis Dialer that reaches each of addrs
// through a fault proxy of its own and each of direct without one, and
// refuses any other address, so that no connection bypasses the faults;
// and the proxies.
func ProxiedDialer(t *testing.T, addrs []string, direct ...string) (Dial, []*faultproxy.Proxy) {
	t.Helper()
	via := make(map[string]string, len(addrs)+len(direct))
	proxies := make([]*faultproxy.Proxy, len(addrs))
	for i, a := range addrs {
		proxies[i] = faultproxy.New(t, a)
		via[a] = proxies[i].Addr()
		if _, port, err := net.SplitHostPort(a); err == nil {
			// A Cluster node that announces no address is named ":port".
			via[":"+port] = proxies[i].Addr()
		}
	}
	for _, a := range direct {
		via[a] = a
	}
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		to, ok := via[addr]
		if !ok {
			return nil, fmt.Errorf("ProxiedDialer: %s is neither a proxied server nor a direct one", addr)
		}
		return d.DialContext(ctx, network, to)
	}, proxies
}

// LockerKeyPrefix is the prefix a Locker puts before every key by default.
const LockerKeyPrefix = "reqlock:"

// SlotServers returns the master that serves storeKey's slot and its
// replica, as CLUSTER SLOTS reports them once it lists the replica.
func SlotServers(t *testing.T, nodes []*testservers.Server, storeKey string) (master, replica *testservers.Server) {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testservers.Addrs(nodes), ContextTimeoutEnabled: true})
	defer c.Close()
	byAddr := func(addr string) *testservers.Server {
		i := slices.IndexFunc(nodes, func(n *testservers.Server) bool { return n.Addr() == addr })
		if i < 0 {
			t.Fatalf("CLUSTER SLOTS names %s, which is none of the nodes", addr)
		}
		return nodes[i]
	}
	var served []redis.ClusterNode
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keySlot, err := c.ClusterKeySlot(ctx, storeKey).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	s := int(keySlot)
	err = PollUntil(ctx, func() error {
		ranges, err := c.ClusterSlots(ctx).Result()
		if err != nil {
			return err
		}
		for _, r := range ranges {
			if s >= r.Start && s <= r.End {
				if served = r.Nodes; len(served) != 2 {
					return fmt.Errorf("slot %d is served by %v, want a master and one replica", s, served)
				}
				return nil
			}
		}
		return fmt.Errorf("no node serves slot %d", s)
	})
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	return byAddr(served[0].Addr), byAddr(served[1].Addr)
}

// RoleIs reports nil when the Redis at addr has that replication role.
func RoleIs(addr, want string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	for line := range strings.Lines(info) {
		if role, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			if role != want {
				return fmt.Errorf("%s is a %s, want a %s", addr, role, want)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: INFO replication has no role", addr)
}

// errStaleFence is the protected resource refusing a fenced read or write.
var errStaleFence = errors.New("stale fence")

// stockRow stands in for a database row of a flash sale's stock, guarded
// by fences as the lock's documentation asks: a read for update or a
// write whose fence is lower than the highest the row has seen is refused,
// and each one that passes records its fence. So once a holder with a
// newer fence has read the row, an older holder can neither read it for
// an update nor write it (the conditional write "where last_fence <=
// my_fence" of a database).
type stockRow struct {
	mu        sync.Mutex
	stock     int
	fence     int64   // the highest fence seen
	writes    []int64 // the fence of every accepted write, in order
	sold      int     // units sold: accepted writes
	threshold int     // sold count at which reached is closed
	reached   chan struct{}
}

func newStockRow(stock, threshold int) *stockRow {
	return &stockRow{stock: stock, threshold: threshold, reached: make(chan struct{})}
}

// readForUpdate returns the stock, when fence is not stale.
func (r *stockRow) readForUpdate(fence int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fence < r.fence {
		return 0, fmt.Errorf("%w: read with fence %d, the row saw %d", errStaleFence, fence, r.fence)
	}
	r.fence = fence
	return r.stock, nil
}

// sell writes the stock left after one unit was sold, when fence is not
// stale.
func (r *stockRow) sell(fence int64, left int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fence < r.fence {
		return fmt.Errorf("%w: write with fence %d, the row saw %d", errStaleFence, fence, r.fence)
	}
	r.fence, r.stock = fence, left
	r.writes = append(r.writes, fence)
	r.sold++
	if r.sold == r.threshold {
		close(r.reached)
	}
	return nil
}

// snapshot returns the stock, units sold and accepted writes' fences.
func (r *stockRow) snapshot() (stock, sold int, writes []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stock, r.sold, slices.Clone(r.writes)
}

// Failover is one topology's failover under load.
type Failover struct {
	Key       string                             // the SKU's lock key, without the Locker's prefix
	NewLocker func(t *testing.T) *reqlock.Locker // one process: its own client, store and Locker
	Kill      func()                             // kills the master that serves key
	NewMaster func() error                       // nil once the servers chose the new master
}

// The failover load: processes × workers goroutines deduct the stock of one
// SKU, one unit per lock.
const (
	loadProcesses  = 4
	loadWorkers    = 5 // per process
	loadStock      = 600
	loadBeforeKill = 100                    // units sold before the kill
	loadTTL        = time.Second            // the workers' lock TTL
	loadWait       = 500 * time.Millisecond // their wait for the lock
	loadWork       = time.Millisecond       // their work under the lock, as a database round trip
	loadRetryAfter = 25 * time.Millisecond  // their pause after a 503, as Retry-After
	loadLimit      = 40 * time.Second       // for the whole run, failover included
	staleTTL       = 300 * time.Millisecond // the stale holder's lock TTL: it lapses during the failover
)

// attempt is one worker's Obtain.
type attempt struct {
	start, end time.Time
	outcome    reqlock.Outcome
	fence      int64
}

// FailoverUnderLoad: loadProcesses processes, each with its own client,
// Store and Locker, run loadWorkers goroutines each that sell one unit of
// a limited stock per lock, through a fenced read and write of stockRow.
// Once loadBeforeKill units are sold, the workers pause while a process of
// its own takes the lock and reads the row for an update; they resume, and
// wait for the lock, as its master is killed. That process then stalls (as
// in a long GC pause) until the service has sold again after the failover,
// and tries its write, which the row must refuse. The workers
// carry on, taking each store error as a 503 and retrying after
// loadRetryAfter, until the stock is sold out.
//
// It checks that the stock is never oversold (units sold never exceed the
// stock, and the stock left is the stock less the units sold), that every
// accepted write carries a fence above the one before, that the fences
// granted after the kill exceed all those granted before it, that the
// failover happened and the service recovered by itself to sell out the
// stock within loadLimit, and that no attempt ended in another way than
// acquired, timeout or store error. It logs the time from the kill to the
// first lock granted after a failed attempt, the 503s (store errors) and
// timeouts meanwhile, the writes refused by the fences and the locks found
// lost at release.
func FailoverUnderLoad(t *testing.T, f Failover) {
	ctx, cancel := context.WithTimeout(context.Background(), loadLimit)
	defer cancel()
	row := newStockRow(loadStock, loadBeforeKill)
	lockers := make([]*reqlock.Locker, loadProcesses)
	for i := range lockers {
		lockers[i] = f.NewLocker(t)
	}
	staleLocker := f.NewLocker(t)

	var (
		killedAt   atomic.Pointer[time.Time]
		failedAt   atomic.Pointer[time.Time] // the end of a first failed attempt after the kill
		recovered  = make(chan struct{})     // closed once a worker read the row after it
		recoverOne sync.Once
		resume     = make(chan struct{}) // closed once the stale holder has the lock
		refused    atomic.Int64          // workers' reads and writes the row refused
		lost       atomic.Int64          // workers' releases that found the lock lost
		releaseErr atomic.Int64          // workers' releases that failed in the store
		mu         sync.Mutex
		attempts   []attempt
		unexpected []error
	)
	afterKill := func(at time.Time) bool {
		k := killedAt.Load()
		return k != nil && at.After(*k)
	}
	worker := func(locker *reqlock.Locker) {
		for ctx.Err() == nil {
			select { // let the stale holder take the lock before the stock runs out
			case <-row.reached:
				select {
				case <-resume:
				case <-ctx.Done():
					return
				}
			default:
			}
			a := attempt{start: time.Now()}
			lock, err := locker.Obtain(ctx, f.Key, loadTTL, loadWait)
			a.end, a.outcome = time.Now(), reqlock.OutcomeOf(ctx, err)
			if lock != nil {
				a.fence = lock.Fence()
			}
			mu.Lock()
			attempts = append(attempts, a)
			if a.outcome != reqlock.OutcomeAcquired && a.outcome != reqlock.OutcomeTimeout &&
				a.outcome != reqlock.OutcomeStoreError && ctx.Err() == nil {
				unexpected = append(unexpected, fmt.Errorf("Obtain: %s: %w", a.outcome, err))
			}
			mu.Unlock()
			if err != nil {
				if afterKill(a.start) {
					failedAt.CompareAndSwap(nil, &a.end)
				}
				if a.outcome == reqlock.OutcomeStoreError && !pause(ctx, loadRetryAfter) {
					return
				}
				continue
			}
			soldOut := sellOne(row, lock.Fence(), &refused)
			if failed := failedAt.Load(); failed != nil && a.start.After(*failed) {
				recoverOne.Do(func() { close(recovered) })
			}
			switch err := lock.Release(context.Background()); {
			case errors.Is(err, reqlock.ErrNotHeld):
				lost.Add(1)
			case err != nil:
				releaseErr.Add(1)
			}
			if soldOut {
				return
			}
		}
	}

	var wg sync.WaitGroup
	for _, l := range lockers {
		for range loadWorkers {
			wg.Go(func() { worker(l) })
		}
	}
	defer wg.Wait()
	defer cancel() // before the Wait: a failed check stops the workers

	select {
	case <-row.reached:
	case <-ctx.Done():
		t.Fatalf("%d units not sold within %v before the kill", loadBeforeKill, loadLimit)
	}
	staleStart := time.Now()
	stale, err := staleLocker.Obtain(ctx, f.Key, staleTTL, 10*time.Second)
	staleWaited := time.Since(staleStart)
	if err != nil {
		t.Fatalf("the stale holder's Obtain: %v", err)
	}
	staleFence := stale.Fence()
	staleStock, err := row.readForUpdate(staleFence)
	if err != nil || staleStock == 0 {
		t.Fatalf("the stale holder's read for update: stock %d, %v; want some stock left (else raise loadStock)", staleStock, err)
	}
	close(resume) // the workers wait for the stale holder's lock when the master dies
	now := time.Now()
	killedAt.Store(&now)
	f.Kill()

	// The stale holder wakes once the service has sold again after the
	// failure: a newer fence has read the row since its own read.
	select {
	case <-recovered:
	case <-ctx.Done():
		t.Fatalf("no lock granted within %v of the kill after the first failure", loadLimit)
	}
	staleWriteErr := row.sell(staleFence, staleStock-1)
	staleReleaseErr := stale.Release(context.Background())
	if !errors.Is(staleWriteErr, errStaleFence) {
		t.Errorf("the stale holder's write (fence %d) after the failover: %v; want it refused as stale", staleFence, staleWriteErr)
	}
	// Its client may not know the new master yet: a store error is its
	// answer then, but a release that succeeds would have deleted a
	// newer holder's lock.
	if !errors.Is(staleReleaseErr, reqlock.ErrNotHeld) && !errors.Is(staleReleaseErr, reqlock.ErrStore) {
		t.Errorf("the stale holder's Release after the failover: %v, want ErrNotHeld (or ErrStore)", staleReleaseErr)
	}

	if err := PollUntil(ctx, f.NewMaster); err != nil {
		t.Fatalf("no failover: %v", err)
	}
	wg.Wait()
	if ctx.Err() != nil {
		stock, sold, _ := row.snapshot()
		t.Fatalf("the service did not sell out within %v: %d sold, %d left", loadLimit, sold, stock)
	}

	stock, sold, writes := row.snapshot()
	if sold > loadStock || stock != loadStock-sold || stock != 0 {
		t.Errorf("sold %d of %d with %d left: want all sold, none oversold", sold, loadStock, stock)
	}
	for i := 1; i < len(writes); i++ {
		if writes[i] <= writes[i-1] {
			t.Errorf("accepted write %d has fence %d, not above the one before, %d", i, writes[i], writes[i-1])
		}
	}
	for _, err := range unexpected {
		t.Error(err)
	}

	killed := *killedAt.Load()
	first := firstFailure(attempts, killed)
	var maxBefore, minAfter int64
	var recoveredAt time.Time
	var storeErrors, timeouts, storeErrorsAll int
	for _, a := range attempts {
		if a.outcome == reqlock.OutcomeStoreError {
			storeErrorsAll++
		}
		switch {
		case a.outcome != reqlock.OutcomeAcquired:
		case a.end.Before(killed):
			maxBefore = max(maxBefore, a.fence)
		case a.start.After(killed) && (minAfter == 0 || a.fence < minAfter):
			minAfter = a.fence
		}
		if a.outcome == reqlock.OutcomeAcquired && a.start.After(first) &&
			(recoveredAt.IsZero() || a.end.Before(recoveredAt)) {
			recoveredAt = a.end
		}
	}
	maxBefore = max(maxBefore, staleFence)
	if minAfter <= maxBefore {
		t.Errorf("a lock granted after the kill has fence %d, not above %d granted before it", minAfter, maxBefore)
	}
	for _, a := range attempts {
		if a.end.After(killed) && !a.end.After(recoveredAt) {
			switch a.outcome {
			case reqlock.OutcomeStoreError:
				storeErrors++
			case reqlock.OutcomeTimeout:
				timeouts++
			}
		}
	}
	t.Logf("kill to first failed attempt %v; kill to first lock granted after it %v; meanwhile %d store errors (503) and %d timeouts",
		first.Sub(killed).Round(time.Millisecond), recoveredAt.Sub(killed).Round(time.Millisecond), storeErrors, timeouts)
	t.Logf("%d attempts, %d store errors in all; %d units sold; fenced reads and writes refused: %d of the workers', "+
		"and the stale holder's write (%v; its release: %v; it waited %v for the lock); "+
		"workers' releases: %d found the lock lost, %d failed in the store",
		len(attempts), storeErrorsAll, sold, refused.Load(), staleWriteErr, staleReleaseErr,
		staleWaited.Round(time.Millisecond), lost.Load(), releaseErr.Load())
}

// sellOne sells one unit under a lock with fence, unless sold out; it
// counts the reads and writes that the row refuses, and reports sold out.
func sellOne(row *stockRow, fence int64, refused *atomic.Int64) (soldOut bool) {
	stock, err := row.readForUpdate(fence)
	if err != nil {
		refused.Add(1)
		return false
	}
	if stock == 0 {
		return true
	}
	time.Sleep(loadWork) // the database round trip the lock protects: work, not a wait
	if err := row.sell(fence, stock-1); err != nil {
		refused.Add(1)
	}
	return false
}

// firstFailure returns the end of the first attempt started after killed
// that failed (the far future when none did).
func firstFailure(attempts []attempt, killed time.Time) time.Time {
	first := killed.Add(time.Hour)
	for _, a := range attempts {
		if a.outcome != reqlock.OutcomeAcquired && a.start.After(killed) && a.end.Before(first) {
			first = a.end
		}
	}
	return first
}

// pause waits d, and reports false when ctx ends first.
func pause(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// PollUntil calls check until it reports nil, and returns its last error
// when ctx ends first.
func PollUntil(ctx context.Context, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		if !pause(ctx, 50*time.Millisecond) {
			return fmt.Errorf("%w; last: %w", ctx.Err(), err)
		}
	}
}
