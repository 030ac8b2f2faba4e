package mysqlstore

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
)

func TestNewRejectsInvalid(t *testing.T) {
	db := openDB(t)
	if _, err := New(nil); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("New(nil): %v, want stores.ErrInvalid", err)
	}
	bad := []struct {
		name string
		opt  Option
		want string
	}{
		{"nil option", nil, "option is nil"},
		{"empty table", WithTable(""), "table"},
		{"table with a dash", WithTable("a-b"), "table"},
		{"table with a backtick", WithTable("a`b"), "table"},
		{"table too long", WithTable(strings.Repeat("t", 65)), "table"},
		{"three-part name", WithTable("a.b.c"), "table"},
		{"short retention", WithPurge(time.Hour, 59*time.Second), "retention"},
		{"negative interval", WithPurge(-time.Hour, time.Hour), "interval"},
	}
	for _, b := range bad {
		if _, err := New(db, b.opt); !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: New: %v; want stores.ErrInvalid naming %q", b.name, err, b.want)
		}
	}
	// No purge goroutine: the retention is not used, so any is accepted.
	if s, err := New(db, WithPurge(0, 0)); err != nil {
		t.Errorf("New with WithPurge(0, 0), the purge goroutine off: %v", err)
	} else {
		_ = s.Close()
	}
	if _, err := Schema("x;DROP TABLE y"); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Schema of a bad name: %v, want stores.ErrInvalid", err)
	}
	if q, err := Schema("locks.reqlock_locks"); err != nil || !strings.Contains(q, "CREATE TABLE IF NOT EXISTS `locks`.`reqlock_locks`") {
		t.Errorf("Schema(locks.reqlock_locks): %q, %v", q, err)
	}
}

// TestSizeLimits: keys and tokens the table cannot hold, and the empty
// token that marks a released key, are refused with ErrInvalid before the
// store acts.
func TestSizeLimits(t *testing.T) {
	s := newStore(t, openDB(t))
	ok := testKeys(1)
	long := []string{ok[0] + strings.Repeat("k", MaxKeyLen)}
	cases := []struct {
		name  string
		keys  []string
		token string
	}{
		{"long key", long, "t1"},
		{"empty token", ok, ""},
		{"long token", ok, strings.Repeat("t", MaxTokenLen+1)},
	}
	for _, c := range cases {
		if g, err := s.Acquire(t.Context(), c.keys, c.token, time.Minute); !errors.Is(err, stores.ErrInvalid) || g.OK {
			t.Errorf("%s: Acquire: %+v, %v; want stores.ErrInvalid", c.name, g, err)
		}
		if err := s.Refresh(t.Context(), c.keys, c.token, time.Minute); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("%s: Refresh: %v; want stores.ErrInvalid", c.name, err)
		}
		if err := s.Release(t.Context(), c.keys, c.token, 0); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("%s: Release: %v; want stores.ErrInvalid", c.name, err)
		}
	}
	// The longest key and token fit.
	maxKey := []string{ok[0] + strings.Repeat("k", MaxKeyLen-len(ok[0]))}
	maxToken := strings.Repeat("t", MaxTokenLen)
	mustAcquire(t, s, maxKey, maxToken, time.Minute)
	if err := s.Release(t.Context(), maxKey, maxToken, 0); err != nil {
		t.Fatalf("Release of the longest key: %v", err)
	}
}

// TestCustomTableWithoutCreate: a Store told not to create its table fails
// until the operator has created it from Schema, then works.
func TestCustomTableWithoutCreate(t *testing.T) {
	db := openDB(t)
	table := "managed_" + strings.ToLower(testKeys(1)[0][16:26])
	s := newStore(t, db, WithTable(table), WithoutCreateTable())
	keys := testKeys(1)
	if _, err := s.Acquire(t.Context(), keys, "t1", time.Minute); err == nil {
		t.Fatal("Acquire without the table succeeded")
	}
	ddl, err := Schema(table)
	if err != nil {
		t.Fatalf("Schema: %v", err)
	}
	if _, err := db.ExecContext(t.Context(), ddl); err != nil {
		t.Fatalf("%s: %v", ddl, err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE `"+table+"`") })
	mustAcquire(t, s, keys, "t1", time.Minute)
}

// TestBounds: the Store states its key column's width as its longest key
// and no TTL bound; it refuses more than MaxKeysPerCall keys in one call
// with ErrInvalid before it acts; and a TTL of math.MaxInt64 (292 years) is
// kept and read back as such, not as an overflow.
func TestBounds(t *testing.T) {
	s := newStore(t, openDB(t))
	if b := s.Bounds(); b.MaxKeyBytes != MaxKeyLen || b.MinTTL != 0 || b.MaxTTL != 0 || b.Reason == "" {
		t.Fatalf("Bounds() = %+v, want MaxKeyBytes %d, no TTL bound, and a reason", b, MaxKeyLen)
	}
	many := testKeys(MaxKeysPerCall + 1)
	if g, err := s.Acquire(t.Context(), many, "t1", time.Minute); !errors.Is(err, stores.ErrInvalid) || g.OK {
		t.Errorf("Acquire of %d keys: %+v, %v; want stores.ErrInvalid", len(many), g, err)
	}
	if err := s.Release(t.Context(), many, "t1", 0); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Release of %d keys: %v; want stores.ErrInvalid", len(many), err)
	}
	if err := s.Refresh(t.Context(), many, "t1", time.Minute); !errors.Is(err, stores.ErrInvalid) {
		t.Errorf("Refresh of %d keys: %v; want stores.ErrInvalid", len(many), err)
	}
	for _, n := range []int{1, 3} {
		keys := testKeys(n)
		mustAcquire(t, s, keys, "t1", math.MaxInt64)
		g, err := s.Acquire(t.Context(), keys, "t2", time.Minute)
		if err != nil || g.OK || g.Wait < math.MaxInt64-time.Hour {
			t.Fatalf("%d keys: Acquire of keys held for math.MaxInt64: %+v, %v; want refused with a Wait of about 292 years", n, g, err)
		}
		if err := s.Release(t.Context(), keys, "t1", math.MaxInt64); err != nil {
			t.Fatalf("%d keys: Release keeping the keys for math.MaxInt64: %v", n, err)
		}
		if g, err := s.Acquire(t.Context(), keys, "t2", time.Minute); err != nil || g.OK || g.Wait < math.MaxInt64-time.Hour {
			t.Fatalf("%d keys: Acquire of keys kept for math.MaxInt64: %+v, %v; want refused with a Wait of about 292 years", n, g, err)
		}
	}
}
