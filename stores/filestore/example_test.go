//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores/filestore"
)

// Example locks a key for the processes of one host. Every process opens
// the same directory; a lock is freed at once when its process dies.
func Example() {
	dir, err := os.MkdirTemp("", "locks")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := filestore.Open(ctx, "file://"+filepath.ToSlash(dir))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	locker, err := reqlock.New(store)
	if err != nil {
		panic(err)
	}
	lock, err := locker.Obtain(ctx, "sku:42", 10*time.Second, 0)
	if err != nil {
		panic(err)
	}
	_, err = locker.Obtain(ctx, "sku:42", 10*time.Second, 0)
	fmt.Println(err)
	next := lock.Fence() + 1024
	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	lock, err = locker.Obtain(ctx, "sku:42", 10*time.Second, 0)
	if err != nil {
		panic(err)
	}
	fmt.Println("fence grew by a stride or more:", lock.Fence() >= next)
	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	// Output:
	// reqlock: lock held by another owner
	// fence grew by a stride or more: true
}
