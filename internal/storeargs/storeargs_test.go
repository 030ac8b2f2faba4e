package storeargs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
)

func TestChecks(t *testing.T) {
	const c Checker = "somestore"
	ctx := context.Background()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	cases := []struct {
		name string
		err  error
		want string // "" for no error
	}{
		{"TTL", c.CheckTTL(time.Second), ""},
		{"ZeroTTL", c.CheckTTL(0), "somestore: ttl 0s is not positive"},
		{"AcquireFair", c.CheckAcquireFair(ctx, time.Second, 0), ""},
		{"AcquireFairZeroTTL", c.CheckAcquireFair(ctx, 0, time.Second), "somestore: ttl 0s must be positive and lease 1s not negative"},
		{"AcquireFairNegativeLease", c.CheckAcquireFair(ctx, time.Second, -time.Second), "somestore: ttl 1s must be positive and lease -1s not negative"},
		{"AcquireAll", c.CheckAcquireAll(ctx, []string{"a", "b"}, time.Second), ""},
		{"AcquireAllNegativeTTL", c.CheckAcquireAll(ctx, []string{"a"}, -time.Second), "somestore: ttl -1s is not positive"},
		{"AcquireAllNoKeys", c.CheckAcquireAll(ctx, nil, time.Second), "somestore: no keys"},
		{"AcquireAllTwice", c.CheckAcquireAll(ctx, []string{"a", "a"}, time.Second), `somestore: key "a" appears twice`},
		{"AcquireAllUnsorted", c.CheckAcquireAll(ctx, []string{"b", "a"}, time.Second), `somestore: keys are not sorted: "b" before "a"`},
		{"ReleaseAll", c.CheckReleaseAll(ctx, []string{"a", "b"}, []int64{1, 2}), ""},
		{"ReleaseAllNoKeys", c.CheckReleaseAll(ctx, []string{}, nil), "somestore: no keys"},
		{"ReleaseAllFences", c.CheckReleaseAll(ctx, []string{"a", "b"}, []int64{1}), "somestore: 1 last fences for 2 keys"},
	}
	for _, tc := range cases {
		switch {
		case tc.want == "" && tc.err != nil:
			t.Errorf("%s: %v, want nil", tc.name, tc.err)
		case tc.want == "":
		case !errors.Is(tc.err, reqlock.ErrInvalid):
			t.Errorf("%s: %v, want ErrInvalid", tc.name, tc.err)
		case tc.err.Error() != reqlock.ErrInvalid.Error()+": "+tc.want:
			t.Errorf("%s: %q, want %q after ErrInvalid", tc.name, tc.err, tc.want)
		}
	}
	// An ended context comes first, as ctx.Err() itself.
	if err := c.CheckAcquireAll(ended, nil, 0); err != context.Canceled {
		t.Errorf("CheckAcquireAll(ended): %v, want context.Canceled", err)
	}
	if err := c.CheckAcquireFair(ended, 0, -1); err != context.Canceled {
		t.Errorf("CheckAcquireFair(ended): %v, want context.Canceled", err)
	}
	if err := c.CheckReleaseAll(ended, nil, []int64{1}); err != context.Canceled {
		t.Errorf("CheckReleaseAll(ended): %v, want context.Canceled", err)
	}
}
