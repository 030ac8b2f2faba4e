package middleware_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// recordCappedStore is a memstore that states the record bounds of a store
// with a small backend, such as etcd's request limit.
type recordCappedStore struct{ *memstore.Store }

func (recordCappedStore) Bounds() stores.Bounds {
	return stores.Bounds{MaxKeyBytes: 120, MaxRecordBytes: 100 << 10, MaxRetention: 48 * time.Hour, Reason: "the request limit"}
}

// TestIdempotencySpecConfig: the spec words reach Config.Idempotency, and
// the defaults fill what they leave out.
func TestIdempotencySpecConfig(t *testing.T) {
	got, err := middleware.ParseSpec("key=sku:<id> idempotency=required idempotency-header=X-Request-Key " +
		"idempotency-retention=1h idempotency-scope=<header:Authorization> idempotency-max-body=1KiB")
	if err != nil {
		t.Fatal(err)
	}
	want := middleware.Idempotency{Mode: middleware.IdempotencyRequired, Header: "X-Request-Key", Retention: time.Hour,
		Scope: "<header:Authorization>", MaxBodyBytes: 1 << 10}
	if got.Idempotency != want {
		t.Fatalf("Idempotency = %+v, want %+v", got.Idempotency, want)
	}
	opt := middleware.Config{Key: "sku:<id>"}
	middleware.WithIdempotency(want)(&opt)
	if !reflect.DeepEqual(got, opt) {
		t.Fatalf("the spec's Config %+v differs from the option's %+v", got, opt)
	}
	g, err := middleware.NewFromSpec(reqlock.MustNew(memstore.New()), "key=a idempotency=optional")
	if err != nil {
		t.Fatal(err)
	}
	if d := g.Config().Idempotency; d != (middleware.Idempotency{Mode: middleware.IdempotencyOptional, Header: "Idempotency-Key",
		Retention: 24 * time.Hour, MaxBodyBytes: 64 << 10}) {
		t.Fatalf("defaults %+v", d)
	}
}

// TestIdempotencyStartUpErrors: a route whose idempotency cannot work fails
// when it is built, naming the route (and the store and its limit when the
// store sets it): in code, and in a route table with its source.
func TestIdempotencyStartUpErrors(t *testing.T) {
	capped := reqlock.MustNew(recordCappedStore{memstore.New()})
	mem := reqlock.MustNew(memstore.New())
	plain := reqlock.MustNew(struct{ stores.Store }{memstore.New()})
	on := func(i middleware.Idempotency) middleware.Option {
		if i.Mode == 0 {
			i.Mode = middleware.IdempotencyRequired
		}
		return middleware.WithIdempotency(i)
	}
	for _, c := range []struct {
		name   string
		locker *reqlock.Locker
		opts   []middleware.Option
		want   []string
	}{
		{"no records", plain, []middleware.Option{on(middleware.Idempotency{})},
			[]string{`route "r"`, "stores.RecordStore", "struct { stores.Store }"}},
		{"fail-open", mem, []middleware.Option{on(middleware.Idempotency{}), middleware.WithFailOpen()},
			[]string{`route "r"`, "fail-closed"}},
		{"mode off", mem, []middleware.Option{middleware.WithIdempotency(middleware.Idempotency{})},
			[]string{`route "r"`, "WithIdempotency(off)"}},
		{"header", mem, []middleware.Option{on(middleware.Idempotency{Header: "Idem Key"})},
			[]string{`route "r"`, `header "Idem Key"`}},
		{"max body over the store's record limit", capped, []middleware.Option{on(middleware.Idempotency{MaxBodyBytes: 100 << 10})},
			[]string{`route "r"`, "102400", "limit of 102400 bytes", "recordCappedStore", "the request limit"}},
		{"retention over the store's", capped, []middleware.Option{on(middleware.Idempotency{Retention: 72 * time.Hour})},
			[]string{`route "r"`, "72h0m0s", "48h0m0s", "the request limit"}},
		{"scope", mem, []middleware.Option{on(middleware.Idempotency{Scope: "<json:a[*]>"})},
			[]string{`route "r"`, "several values"}},
		{"record key over the store's key limit", capped, []middleware.Option{on(middleware.Idempotency{}),
			middleware.WithName("r" + strings.Repeat("x", 60))}, []string{"record keys", "limit of 120 bytes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := append([]middleware.Option{middleware.WithName("r")}, c.opts...)
			_, err := middleware.New(c.locker, "sku:<id>", opts...)
			if !errors.Is(err, middleware.ErrInvalidConfig) {
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := middleware.New(capped, "sku:<id>", on(middleware.Idempotency{Retention: 48 * time.Hour})); err != nil {
		t.Errorf("a route within the store's bounds: %v", err)
	}

	e, err := routetable.ParseEntry("POST /skus/{id}/deduct", "@lock key=sku:<id> idempotency=required idempotency-max-body=1MiB", "routes.yaml:3")
	if err != nil {
		t.Fatal(err)
	}
	_, err = middleware.NewRoutes(capped, []routetable.Entry{e})
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "routes.yaml:3") ||
		!strings.Contains(err.Error(), "limit of 102400 bytes") {
		t.Errorf("NewRoutes with a record over the store's limit = %v, want ErrInvalidConfig naming the entry and the limit", err)
	}
	if _, err := middleware.NewRoutes(mem, nil, middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired})); !errors.Is(err, middleware.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "Idempotency") {
		t.Errorf("idempotency as a table-wide option = %v, want ErrInvalidConfig naming it", err)
	}
}
