package main

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// stockStores returns each stock store, with the lock store whose fences
// it meets in the service, and a SKU name unique to the test.
func stockStores(t *testing.T) []struct {
	name  string
	stock stockStore
	locks stores.Store
	sku   string
} {
	client := testredis.Client(t)
	rs, err := redisstore.New(client)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	return []struct {
		name  string
		stock stockStore
		locks stores.Store
		sku   string
	}{
		{"memory", newMemStock(), memstore.New(), "X"},
		{"redis", newRedisStock(client), rs, redisSKU(t, "X")},
	}
}

// readStock reads sku without a fence and fails the test on an error.
func readStock(t *testing.T, s stockStore, sku string) (int64, bool) {
	t.Helper()
	stock, found, err := s.Read(context.Background(), sku, 0)
	if err != nil {
		t.Fatalf("Read(%q): %v", sku, err)
	}
	return stock, found
}

// TestStockStoreFencedWrite checks the fencing rules on both stock stores: a
// write with a lower fence than the stored one is refused and changes
// nothing; an equal or higher fence writes; fence 0 writes unchecked and
// leaves the stored fence alone.
func TestStockStoreFencedWrite(t *testing.T) {
	ctx := context.Background()
	for _, tc := range stockStores(t) {
		t.Run(tc.name, func(t *testing.T) {
			s, sku := tc.stock, tc.sku
			if _, found := readStock(t, s, sku); found {
				t.Fatal("a SKU never written was found")
			}
			if err := s.Write(ctx, sku, 10, 5); err != nil {
				t.Fatalf("Write fence 5: %v", err)
			}
			if err := s.Write(ctx, sku, 9, 4); !errors.Is(err, ErrStaleFence) {
				t.Fatalf("Write fence 4 after fence 5: %v, want ErrStaleFence", err)
			}
			if got, _ := readStock(t, s, sku); got != 10 {
				t.Fatalf("stock %d after a refused write, want 10", got)
			}
			if err := s.Write(ctx, sku, 8, 5); err != nil {
				t.Fatalf("Write with the same fence 5: %v", err)
			}
			if err := s.Write(ctx, sku, 7, 0); err != nil {
				t.Fatalf("unfenced Write: %v", err)
			}
			if err := s.Write(ctx, sku, 6, 4); !errors.Is(err, ErrStaleFence) {
				t.Fatalf("Write fence 4 after an unfenced write: %v, want ErrStaleFence (fence 5 still stored)", err)
			}
			if err := s.Write(ctx, sku, 6, 6); err != nil {
				t.Fatalf("Write fence 6: %v", err)
			}
			if got, found := readStock(t, s, sku); got != 6 || !found {
				t.Fatalf("stock %d (found %v), want 6", got, found)
			}
		})
	}
}

// TestStockStoreFencedRead checks that a fenced read claims the SKU: after
// a read with fence 7, reads and writes with a lower fence are refused, so
// a holder that read before a newer one cannot write its stale result.
func TestStockStoreFencedRead(t *testing.T) {
	ctx := context.Background()
	for _, tc := range stockStores(t) {
		t.Run(tc.name, func(t *testing.T) {
			s, sku := tc.stock, tc.sku
			if _, found, err := s.Read(ctx, sku, 3); err != nil || found {
				t.Fatalf("fenced Read of a new SKU: found %v, %v; want not found", found, err)
			}
			if err := s.Write(ctx, sku, 50, 3); err != nil {
				t.Fatalf("Write fence 3: %v", err)
			}
			if got, found, err := s.Read(ctx, sku, 7); err != nil || !found || got != 50 {
				t.Fatalf("Read fence 7: %d, %v, %v; want 50", got, found, err)
			}
			if _, _, err := s.Read(ctx, sku, 6); !errors.Is(err, ErrStaleFence) {
				t.Fatalf("Read fence 6 after fence 7: %v, want ErrStaleFence", err)
			}
			if err := s.Write(ctx, sku, 49, 6); !errors.Is(err, ErrStaleFence) {
				t.Fatalf("Write fence 6 after a read with fence 7: %v, want ErrStaleFence", err)
			}
			if err := s.Write(ctx, sku, 49, 7); err != nil {
				t.Fatalf("Write fence 7: %v", err)
			}
			if got, _ := readStock(t, s, sku); got != 49 {
				t.Fatalf("stock %d, want 49", got)
			}
		})
	}
}

// TestStockStoreRefusesExpiredHolder plays the case fencing exists for with
// real locks on both stores: holder A's lease expires after its read; B
// obtains the lock (with a higher fence), reads and writes; A's late write
// is refused and B's result stands.
func TestStockStoreRefusesExpiredHolder(t *testing.T) {
	ctx := context.Background()
	for _, tc := range stockStores(t) {
		t.Run(tc.name, func(t *testing.T) {
			locker, err := reqlock.New(tc.locks, reqlock.WithKeyPrefix(redisSKU(t, "lock:")))
			if err != nil {
				t.Fatal(err)
			}
			sh := &shop{store: tc.stock, defaultStock: 100}
			a, err := locker.Obtain(ctx, "sku", 30*time.Millisecond, 0)
			if err != nil {
				t.Fatalf("A: %v", err)
			}
			stockA, _, err := tc.stock.Read(ctx, tc.sku, a.Fence())
			if err != nil {
				t.Fatalf("A's read: %v", err)
			}
			// B waits for A's lease to expire: Obtain returns once the key is free.
			b, err := locker.Obtain(ctx, "sku", 10*time.Second, 10*time.Second)
			if err != nil {
				t.Fatalf("B: %v", err)
			}
			defer func() { _ = b.Release(ctx) }()
			if b.Fence() <= a.Fence() {
				t.Fatalf("B's fence %d is not above A's %d", b.Fence(), a.Fence())
			}
			left, err := sh.Deduct(ctx, tc.sku, 1, b.Fence(), 0)
			if err != nil || left != 99 {
				t.Fatalf("B's deduction: %d, %v; want 99", left, err)
			}
			if err := tc.stock.Write(ctx, tc.sku, stockA-1, a.Fence()); !errors.Is(err, ErrStaleFence) {
				t.Fatalf("A's late write: %v, want ErrStaleFence", err)
			}
			if got, _ := readStock(t, tc.stock, tc.sku); got != 99 {
				t.Fatalf("stock %d, want B's 99", got)
			}
		})
	}
}

// TestDeductWorkHonoursContext checks that the simulated work stops when the
// request's context ends, also as the work ends, and that nothing is written
// then.
func TestDeductWorkHonoursContext(t *testing.T) {
	s := newMemStock()
	sh := &shop{store: s, defaultStock: 100}
	ctx, cancel := context.WithCancel(context.Background())
	sh.testHookAfterRead = func(context.Context) { cancel() }
	if _, err := sh.Deduct(ctx, "X", 1, 0, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Deduct with a cancelled context: %v, want context.Canceled", err)
	}
	if _, found := readStock(t, s, "X"); found {
		t.Fatal("a cancelled deduction wrote the stock")
	}
	// The context ends just as the work does: whichever the work notices
	// first, no write starts on the ended context (a Redis write would be
	// refused by go-redis unsent, and look like a write whose outcome is
	// unknown). Each try is a coin toss without the check after the work.
	for i := range 64 {
		ctx, cancel := context.WithCancelCause(context.Background())
		sh.testHookAfterRead = func(context.Context) { cancel(reqlock.ErrLockLost) }
		sku := fmt.Sprint("Y", i)
		if _, err := sh.Deduct(ctx, sku, 1, 0, time.Nanosecond); !errors.Is(err, reqlock.ErrLockLost) {
			t.Fatalf("Deduct whose context ended with its work: %v, want its cause, reqlock.ErrLockLost", err)
		}
		if _, found := readStock(t, s, sku); found {
			t.Fatalf("try %d: a deduction whose context ended with its work wrote the stock", i)
		}
	}
}

// TestStockStoreDeductAll checks the multi-SKU check-and-deduct on both
// stock stores: it deducts every SKU or none; a stale fence on any SKU, or
// any short SKU, changes no stock and records no fence; the error names the
// stale SKU or every short one; a SKU never set has the default stock; and
// stocks beyond 2^53 stay exact.
func TestStockStoreDeductAll(t *testing.T) {
	ctx := context.Background()
	for _, tc := range stockStores(t) {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.stock
			a, b, c := tc.sku+"a", tc.sku+"b", tc.sku+"c" // b is never set
			if err := s.Write(ctx, a, 10, 5); err != nil {
				t.Fatal(err)
			}
			unchanged := func(what string) {
				t.Helper()
				if got, _ := readStock(t, s, a); got != 10 {
					t.Fatalf("%s: stock of a %d, want 10", what, got)
				}
				if _, found := readStock(t, s, b); found {
					t.Fatalf("%s: b was written", what)
				}
			}

			_, err := s.DeductAll(ctx, []deduction{{b, 1, 9}, {a, 1, 4}}, 7)
			var stale *staleFenceError
			if !errors.As(err, &stale) || !errors.Is(err, ErrStaleFence) || stale.sku != a || stale.saw != 5 {
				t.Fatalf("DeductAll with a stale fence on a: %v, want ErrStaleFence naming a and fence 5", err)
			}
			unchanged("a stale fence")

			var short *shortError
			_, err = s.DeductAll(ctx, []deduction{{a, 11, 6}, {b, 2, 6}}, 7)
			if !errors.As(err, &short) || !errors.Is(err, ErrInsufficientStock) ||
				!reflect.DeepEqual(short.items, []shortItem{{a, 11, 10}}) {
				t.Fatalf("DeductAll with a short: %v, want a shortError naming a (qty 11, stock 10)", err)
			}
			unchanged("a short SKU")
			_, err = s.DeductAll(ctx, []deduction{{a, 11, 6}, {b, 8, 6}}, 7)
			if !errors.As(err, &short) || !reflect.DeepEqual(short.items, []shortItem{{a, 11, 10}, {b, 8, 7}}) {
				t.Fatalf("DeductAll with two shorts: %v, want both named", err)
			}
			unchanged("two short SKUs")
			// The refused calls recorded no fence: 5 is still a's, none is b's.
			if err := s.Write(ctx, a, 10, 5); err != nil {
				t.Fatalf("a's fence moved past 5 in a refused DeductAll: %v", err)
			}

			left, err := s.DeductAll(ctx, []deduction{{a, 10, 6}, {b, 3, 6}}, 7)
			if err != nil || !reflect.DeepEqual(left, []int64{0, 4}) {
				t.Fatalf("DeductAll: %v, %v; want [0 4]", left, err)
			}
			if got, found := readStock(t, s, b); got != 4 || !found {
				t.Fatalf("stock of b %d (found %v), want 4", got, found)
			}
			for _, sku := range []string{a, b} {
				if err := s.Write(ctx, sku, 1, 5); !errors.Is(err, ErrStaleFence) {
					t.Fatalf("Write with fence 5 after DeductAll with fence 6 on %s: %v, want ErrStaleFence", sku, err)
				}
			}

			const big = 1<<62 + 1 // not a float64
			if err := s.Write(ctx, c, big, 0); err != nil {
				t.Fatal(err)
			}
			_, err = s.DeductAll(ctx, []deduction{{c, big + 1, 0}}, 7)
			if !errors.As(err, &short) || !reflect.DeepEqual(short.items, []shortItem{{c, big + 1, big}}) {
				t.Fatalf("DeductAll of %d from %d: %v, want short", int64(big+1), int64(big), err)
			}
			left, err = s.DeductAll(ctx, []deduction{{c, big - 3, 0}}, 7)
			if err != nil || !reflect.DeepEqual(left, []int64{3}) {
				t.Fatalf("DeductAll of %d from %d: %v, %v; want [3]", int64(big-3), int64(big), left, err)
			}
			// Unfenced, it recorded no fence.
			if err := s.Write(ctx, c, 3, 1); err != nil {
				t.Fatalf("Write with fence 1 after an unfenced DeductAll: %v", err)
			}
		})
	}
}
