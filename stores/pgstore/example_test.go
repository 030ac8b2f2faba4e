package pgstore_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/pgstore"
)

// Example locks one SKU around a stock update. It needs a PostgreSQL on
// localhost:5432, so it is compiled but not run by go test.
func Example() {
	ctx := context.Background()
	// Creates the table reqlock_locks when missing.
	store, err := pgstore.Open(ctx, "postgres://app:secret@localhost:5432/shop?sslmode=disable&table=reqlock_locks")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // closes its pool and its listening connection
	locker, err := reqlock.New(store)
	if err != nil {
		log.Fatal(err)
	}

	// Hold sku:42 for up to 10s, waiting up to 2s for another holder.
	lock, err := locker.Obtain(ctx, "sku:42", 10*time.Second, 2*time.Second)
	switch {
	case errors.Is(err, reqlock.ErrWaitEnded):
		log.Print("busy, try again later")
		return
	case err != nil:
		log.Fatal(err) // ErrStore: PostgreSQL is down or timed out
	}
	defer func() {
		if err := lock.Release(ctx); err != nil {
			log.Print(err)
		}
	}()

	// Pass the fence with the write so the database can refuse a stale holder:
	//   UPDATE stock SET n = n - 1, fence = $1 WHERE sku = 42 AND fence < $1
	log.Printf("holding %s with fence %d", lock.Key(), lock.Fence())
}
