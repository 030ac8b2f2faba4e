package pgstore_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/pgstore"
	"github.com/reqlock/reqlock/stores/storetest/storebench"
)

// The peer is the mechanism of github.com/allisson/go-pglock (and of
// PostgreSQL's own documentation): a session advisory lock, SELECT
// pg_advisory_lock($1) and pg_advisory_unlock($1), on a connection pinned
// to each holder. Neither that module nor cirello.io/pglock can be fetched
// here (the module proxy answers 403), and allisson/go-pglock's Lock is
// nothing but those two statements on a *sql.DB, so the peer runs them
// itself, over pgx, on one dedicated connection per worker: the use that
// library needs to be correct (a pooled *sql.DB may unlock on another
// session than the one that locked).

// warmStore returns a Store over a pool of the default size whose
// connections are all open, as the peer's are before the clock starts:
// dialling (and SCRAM authentication) is not what is measured.
func warmStore(b *testing.B) stores.Store {
	ctx := b.Context()
	db := pool(b, testservers.PostgresDSN(b))
	conns := make([]*pgxpool.Conn, db.Config().MaxConns)
	for i := range conns {
		c, err := db.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
	s, err := pgstore.New(ctx, db)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// advisory is the peer: one connection per worker, each key an advisory
// lock id hashed from it.
var advisory = storebench.Side{Name: "advisory", Open: func(b *testing.B, workers int) storebench.Lock {
	dsn := testservers.PostgresDSN(b)
	conns := make([]*pgx.Conn, workers)
	for i := range conns {
		c, err := pgx.Connect(b.Context(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
		b.Cleanup(func() { _ = c.Close(context.Background()) })
	}
	return func(ctx context.Context, worker int, key string) (func() error, error) {
		c := conns[worker]
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		id := int64(h.Sum64())
		if _, err := c.Exec(ctx, `SELECT pg_advisory_lock($1)`, id); err != nil {
			return nil, err
		}
		return func() error {
			var ok bool
			if err := c.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, id).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("unlock: %v, %v", ok, err)
			}
			return nil
		}, nil
	}
}}

// BenchmarkCompare runs each workload of storebench (hot, spread, cycles)
// for reqlock (a Locker with its defaults over a Store whose pool has
// pgxpool's default max(4, CPUs) connections) and for the peer (one
// connection per worker), alternating them three times in one run:
//
//	go test -run '^$' -bench Compare -benchtime 1s ./  (in stores/pgstore)
func BenchmarkCompare(b *testing.B) {
	for _, w := range storebench.Workloads() {
		b.Run(w.Name, func(b *testing.B) {
			storebench.Compare(b, w, 3, storebench.Reqlock("reqlock", warmStore), advisory)
		})
	}
}
