package redisstore_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// Example locks one SKU around a stock update. It needs a Redis on
// localhost:6379, so it is compiled but not run by go test.
func Example() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "localhost:6379",
		ContextTimeoutEnabled: true, // let deadlines bound a stalled Redis
	})
	defer client.Close()

	store, err := redisstore.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // stops its pub/sub, before the client closes
	ctx := context.Background()
	if err := store.Load(ctx); err != nil { // optional warm-up
		log.Fatal(err)
	}
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
		log.Fatal(err) // ErrStore: Redis is down or timed out
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
