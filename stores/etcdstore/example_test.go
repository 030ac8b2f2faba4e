package etcdstore_test

import (
	"context"
	"log"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/etcdstore"
)

// A Locker over a three-member etcd cluster, with the store's keys under
// "shop/locks/". Fair mode (WithFairness) grants each key to processes in
// the order they came, woken one at a time by etcd's watch.
func Example() {
	ctx := context.Background()
	store, err := etcdstore.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/shop/locks?timeout=3s")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	locker, err := reqlock.New(store, reqlock.WithFairness(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	lock, err := locker.Obtain(ctx, "sku:42", 10*time.Second, 2*time.Second)
	if err != nil {
		log.Fatal(err) // reqlock.ErrWaitEnded, reqlock.ErrStore, ...
	}
	defer lock.Release(context.Background())
	// Write to the stock only where its last fence is below lock.Fence().
}
