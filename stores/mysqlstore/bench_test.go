package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest/storebench"
)

// The benchmarks compare reqlock (a reqlock.Locker over a Store) with the
// mechanism of github.com/sanketplus/go-mysql-lock, the usual Go lock on
// MySQL: GET_LOCK on a connection pinned for the lock's life, a goroutine
// that pings that connection every second, and DO RELEASE_LOCK then the
// connection's return to the pool on release. The module proxy refused that
// module (403), so getLocker below follows its documented behaviour; the
// code is this package's own. Both run against the same server in the same
// run, one after the other, and each case runs three times, alternated,
// after a warm-up of both:
//
//	go test -run '^$' -bench . -benchtime 1000x ./stores/mysqlstore/
//
// The workloads and their figures are storebench's (see that package).

// benchWait is the peer's GET_LOCK timeout, as reqlock's Wait.
const benchWait = storebench.Wait

// getLocker is the GET_LOCK mechanism of sanketplus/go-mysql-lock.
type getLocker struct {
	db      *sql.DB
	refresh time.Duration // how often a held lock's connection is pinged
}

func (g getLocker) obtain(ctx context.Context, _ int, key string) (func() error, error) {
	conn, err := g.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var res int
	// Its ObtainTimeoutContext: GET_LOCK with a timeout in seconds.
	// (Its Obtain and ObtainContext pass -1, for which MariaDB 10.11's
	// GET_LOCK answers NULL at once: they fail on the test server.)
	if err := conn.QueryRowContext(ctx, "SELECT COALESCE(GET_LOCK(?, ?), 2)", key, int(benchWait/time.Second)).Scan(&res); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if res != 1 {
		_ = conn.Close()
		return nil, fmt.Errorf("GET_LOCK(%q) answered %d", key, res)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // the refresher: a failed ping means the lock is lost
		defer close(stopped)
		t := time.NewTicker(g.refresh)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				pctx, cancel := context.WithTimeout(context.Background(), g.refresh)
				err := conn.PingContext(pctx)
				cancel()
				if err != nil {
					return
				}
			}
		}
	}()
	return func() error {
		close(stop)
		<-stopped
		_, err := conn.ExecContext(context.Background(), "DO RELEASE_LOCK(?)", key)
		return errors.Join(err, conn.Close())
	}, nil
}

// sides are the locks compared, in the order they run: reqlock over a
// Store, and the peer.
func sides() []storebench.Side {
	return []storebench.Side{
		storebench.Reqlock("reqlock", func(b *testing.B) stores.Store { return newStore(b, openDB(b)) }),
		{Name: "getlock", Open: func(b *testing.B, _ int) storebench.Lock {
			return getLocker{db: openDB(b), refresh: time.Second}.obtain
		}},
	}
}

// BenchmarkHot: storebench.Hot, 50 goroutines on one key, holding it 1ms.
func BenchmarkHot(b *testing.B) { storebench.Compare(b, storebench.Hot, 3, sides()...) }

// BenchmarkSpread: storebench.Spread, 50 workers on 1000 keys, never one
// key at once, no hold.
func BenchmarkSpread(b *testing.B) { storebench.Compare(b, storebench.Spread, 3, sides()...) }

// BenchmarkCycles: storebench.Cycles, one goroutine acquires and releases
// one key in turn.
func BenchmarkCycles(b *testing.B) { storebench.Compare(b, storebench.Cycles, 3, sides()...) }
