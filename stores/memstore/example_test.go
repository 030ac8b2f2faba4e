package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/memstore"
)

// Example locks a key in one process. The Store's fences come from one
// counter that every grant moves on by stores.FenceStride (1024).
func Example() {
	locker, err := reqlock.New(memstore.New())
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	lock, err := locker.Obtain(ctx, "sku:42", 10*time.Second, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("fence", lock.Fence())

	_, err = locker.Obtain(ctx, "sku:42", 10*time.Second, 0)
	fmt.Println(err)

	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	lock, err = locker.Obtain(ctx, "sku:42", 10*time.Second, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("fence", lock.Fence())
	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	// Output:
	// fence 1024
	// reqlock: lock held by another owner
	// fence 2048
}
