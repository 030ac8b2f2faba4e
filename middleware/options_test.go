package middleware_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestOptionZeroValues: an option given a value that means nothing for its
// field is an error at construction naming the option and the value, while
// a zero field of a Config built by hand takes the default, and WithWait(0)
// keeps its meaning, try once.
func TestOptionZeroValues(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	for _, tc := range []struct {
		opt  middleware.Option
		want string
	}{
		{middleware.WithTTL(0), "WithTTL(0s)"},
		{middleware.WithMaxKeys(0), "WithMaxKeys(0)"},
		{middleware.WithTimeoutStatus(0), "WithTimeoutStatus(0)"},
		{middleware.WithMaxBodyBytes(0), "WithMaxBodyBytes(0)"},
		{middleware.WithMaxValueLen(0), "WithMaxValueLen(0)"},
		{middleware.WithRetryAfter(0), "WithRetryAfter(0s)"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			g, err := middleware.New(locker, "item:<id>", tc.opt)
			if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "leave the option out") {
				t.Fatalf("New = %v, %v; want ErrInvalidConfig naming %s", g, err, tc.want)
			}
		})
	}

	t.Run("two bad options are both named", func(t *testing.T) {
		_, err := middleware.New(locker, "item:<id>", middleware.WithTTL(0), middleware.WithMaxKeys(0))
		if err == nil || !strings.Contains(err.Error(), "WithTTL(0s)") || !strings.Contains(err.Error(), "WithMaxKeys(0)") {
			t.Fatalf("err = %v, want both options named", err)
		}
	})

	t.Run("zero Config fields take the defaults", func(t *testing.T) {
		g, err := middleware.NewWithConfig(locker, middleware.Config{Key: "item:<id>"})
		if err != nil {
			t.Fatal(err)
		}
		got, d := g.Config(), middleware.DefaultConfig
		if got.TTL != d.TTL || got.Wait != d.Wait || got.TimeoutStatus != d.TimeoutStatus || got.RetryAfter != d.RetryAfter ||
			got.MaxBodyBytes != d.MaxBodyBytes || got.MaxValueLen != d.MaxValueLen || got.MaxKeys != d.MaxKeys {
			t.Fatalf("config %+v, want DefaultConfig's values", got)
		}
	})

	t.Run("WithWait(0) tries once", func(t *testing.T) {
		g, err := middleware.New(locker, "item:<id>", middleware.WithWait(0))
		if err != nil || g.Config().Wait != middleware.NoWait {
			t.Fatalf("New = %v; wait %v, want NoWait", err, g.Config().Wait)
		}
	})

	t.Run("meaningful values are kept", func(t *testing.T) {
		g, err := middleware.New(locker, "item:<id>", middleware.WithTTL(time.Minute), middleware.WithMaxKeys(3),
			middleware.WithTimeoutStatus(http.StatusConflict), middleware.WithMaxBodyBytes(10),
			middleware.WithMaxValueLen(20), middleware.WithRetryAfter(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		c := g.Config()
		if c.TTL != time.Minute || c.MaxKeys != 3 || c.TimeoutStatus != http.StatusConflict || c.MaxBodyBytes != 10 ||
			c.MaxValueLen != 20 || c.RetryAfter != 3*time.Second {
			t.Fatalf("config %+v", c)
		}
	})
}
