package middleware_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/routetable"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/memstore"
)

// cappedStore is a memstore that states the bounds of a store with a small
// backend, such as a ZooKeeper session or an etcd request limit.
type cappedStore struct{ *memstore.Store }

func (cappedStore) Bounds() stores.Bounds {
	return stores.Bounds{MaxKeyBytes: 100, MinTTL: time.Millisecond, MaxTTL: 10 * time.Second, Reason: "the session timeout"}
}

// TestRouteOutOfStoreBoundsFailsAtStartUp: a route whose TTL the store cannot
// honour, or whose key template can render keys longer than the store
// takes, fails when it is built, naming the route, the store and the range;
// in code and in a route table.
func TestRouteOutOfStoreBoundsFailsAtStartUp(t *testing.T) {
	locker := reqlock.MustNew(cappedStore{memstore.New()})
	cases := []struct {
		name string
		opts []middleware.Option
		key  string
		want []string
	}{
		{"ttl", []middleware.Option{middleware.WithTTL(30 * time.Second), middleware.WithName("deduct")},
			"sku:<id>", []string{`route "deduct"`, "30s", "[1ms, 10s]", "the session timeout", "cappedStore"}},
		{"hold at least", []middleware.Option{middleware.WithHoldAtLeast(time.Hour), middleware.WithName("submit")},
			"order:<id>", []string{`route "submit"`, "HoldAtLeast", "1h0m0s", "[1ms, 10s]"}},
		{"key", []middleware.Option{middleware.WithName("long"), middleware.WithMaxValueLen(200)},
			"sku:<id>", []string{`route "long"`, "212 bytes", "limit of 100 bytes", "MaxValueLen", "cappedStore"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := middleware.New(locker, c.key, c.opts...)
			if !errors.Is(err, middleware.ErrInvalidConfig) || !errors.Is(err, reqlock.ErrInvalid) {
				t.Fatalf("New = %v, want ErrInvalidConfig and reqlock.ErrInvalid", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := middleware.New(locker, "sku:<id>", middleware.WithTTL(10*time.Second)); err != nil {
		t.Errorf("a route at the store's MaxTTL: %v", err)
	}

	e, err := routetable.ParseEntry("POST /skus/{id}/deduct", "@lock key=sku:<id> ttl=1m", "routes.yaml:3")
	if err != nil {
		t.Fatal(err)
	}
	_, err = middleware.NewRoutes(locker, []routetable.Entry{e})
	if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "routes.yaml:3") ||
		!strings.Contains(err.Error(), "[1ms, 10s]") {
		t.Errorf("NewRoutes with a 1m TTL = %v, want ErrInvalidConfig naming the entry and the range", err)
	}
}
