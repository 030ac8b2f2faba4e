package storeargs

import (
	"context"
	"errors"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/stores"
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
		{"AcquireFair", c.CheckAcquireFair(ctx, "k", time.Second, 0), ""},
		{"AcquireFairEmptyKey", c.CheckAcquireFair(ctx, "", time.Second, 0), "somestore: empty key"},
		{"AcquireFairZeroTTL", c.CheckAcquireFair(ctx, "k", 0, time.Second), "somestore: ttl 0s must be positive and lease 1s not negative"},
		{"AcquireFairNegativeLease", c.CheckAcquireFair(ctx, "k", time.Second, -time.Second), "somestore: ttl 1s must be positive and lease -1s not negative"},
		{"Acquire", c.CheckAcquire(ctx, []string{"a", "b"}, time.Second), ""},
		{"AcquireNegativeTTL", c.CheckAcquire(ctx, []string{"a"}, -time.Second), "somestore: ttl -1s is not positive"},
		{"AcquireNoKeys", c.CheckAcquire(ctx, nil, time.Second), "somestore: no keys"},
		{"AcquireEmptyKey", c.CheckAcquire(ctx, []string{"", "a"}, time.Second), "somestore: empty key"},
		{"AcquireTwice", c.CheckAcquire(ctx, []string{"a", "a"}, time.Second), `somestore: key "a" appears twice`},
		{"AcquireUnsorted", c.CheckAcquire(ctx, []string{"b", "a"}, time.Second), `somestore: keys are not sorted: "b" before "a"`},
		{"Release", c.CheckRelease(ctx, []string{"a", "b"}), ""},
		{"ReleaseNoKeys", c.CheckRelease(ctx, []string{}), "somestore: no keys"},
		{"LongKeysUnsorted", c.CheckAcquire(ctx, []string{strings.Repeat("b", 600_000), "a"}, time.Second),
			`somestore: keys are not sorted: "` + strings.Repeat("b", 64) + `"... before "a"`},
		{"LongKeyTwice", c.CheckAcquire(ctx, []string{strings.Repeat("b", 600_000), strings.Repeat("b", 600_000)}, time.Second),
			`somestore: key "` + strings.Repeat("b", 64) + `"... appears twice`},
	}
	for _, tc := range cases {
		switch {
		case tc.want == "" && tc.err != nil:
			t.Errorf("%s: %v, want nil", tc.name, tc.err)
		case tc.want == "":
		case !errors.Is(tc.err, stores.ErrInvalid):
			t.Errorf("%s: %v, want ErrInvalid", tc.name, tc.err)
		case tc.err.Error() != stores.ErrInvalid.Error()+": "+tc.want:
			t.Errorf("%s: %q, want %q after ErrInvalid", tc.name, tc.err, tc.want)
		}
	}
	// An ended context comes first, as ctx.Err() itself.
	if err := c.CheckAcquire(ended, nil, 0); err != context.Canceled {
		t.Errorf("CheckAcquire(ended): %v, want context.Canceled", err)
	}
	if err := c.CheckRelease(ended, nil); err != context.Canceled {
		t.Errorf("CheckRelease(ended): %v, want context.Canceled", err)
	}
	if err := c.CheckAcquireFair(ended, "", 0, 0); err != context.Canceled {
		t.Errorf("CheckAcquireFair(ended): %v, want context.Canceled", err)
	}
}

func TestMillis(t *testing.T) {
	for _, c := range []struct {
		ms   int64
		want time.Duration
	}{
		{-5, 0},
		{0, 0},
		{1500, 1500 * time.Millisecond},
		{math.MaxInt64 / int64(time.Millisecond), time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond},
		{math.MaxInt64/int64(time.Millisecond) + 1, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
	} {
		if got := Millis(c.ms); got != c.want {
			t.Errorf("Millis(%d) = %v, want %v", c.ms, got, c.want)
		}
	}
}

func TestCheckBounds(t *testing.T) {
	const c Checker = "teststore"
	b := stores.Bounds{MaxKeyBytes: 8, MinTTL: time.Millisecond, MaxTTL: time.Hour, Reason: "the test"}
	if err := c.CheckBounds(b, []string{"12345678"}, time.Millisecond, time.Hour); err != nil {
		t.Errorf("in bounds: %v", err)
	}
	for _, args := range []struct {
		keys []string
		d    time.Duration
	}{
		{[]string{"123456789"}, time.Second},
		{[]string{"k"}, time.Nanosecond},
		{[]string{"k"}, math.MaxInt64},
	} {
		err := c.CheckBounds(b, args.keys, args.d)
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), "invalid argument: teststore: ") || !strings.Contains(err.Error(), "the test") {
			t.Errorf("CheckBounds(%q, %v) = %v, want ErrInvalid from teststore naming the reason", args.keys, args.d, err)
		}
	}
}

func TestParseConnect(t *testing.T) {
	const c Checker = "somestore"
	for _, tc := range []struct {
		query string
		want  Connect
		err   string // "" for no error
	}{
		{"", ConnectCheck, ""},
		{"connect=check", ConnectCheck, ""},
		{"connect=lazy&table=t", ConnectLazy, ""},
		{"connect=", ConnectCheck, `somestore: URL parameter connect="": want check`},
		{"connect=Lazy", ConnectCheck, `somestore: URL parameter connect="Lazy": want check`},
		{"connect=lazy&connect=lazy", ConnectCheck, "somestore: URL parameter connect given 2 times"},
	} {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.ParseConnect(q)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("%q: got %v, %v; want %v", tc.query, got, err, tc.want)
			}
			if q.Has(ConnectParam) {
				t.Errorf("%q: the parameter is still in the query", tc.query)
			}
			continue
		}
		if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: got %v; want an ErrInvalid containing %q", tc.query, err, tc.err)
		}
	}
}

func TestConnectContext(t *testing.T) {
	ctx, cancel := ConnectContext(context.Background())
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > DefaultConnectTimeout {
		t.Errorf("no deadline within %v: %v, %v", DefaultConnectTimeout, d, ok)
	}
	parent, cancelParent := context.WithTimeout(context.Background(), time.Hour)
	defer cancelParent()
	ctx2, cancel2 := ConnectContext(parent)
	defer cancel2()
	if d, _ := ctx2.Deadline(); time.Until(d) < time.Minute {
		t.Errorf("the context's own deadline was not kept: %v", d)
	}
	err := Checker("somestore").Unreachable([]string{"127.0.0.1:1"}, errors.New("refused"))
	if !errors.Is(err, stores.ErrUnreachable) || !strings.Contains(err.Error(), "somestore: cannot reach 127.0.0.1:1") {
		t.Errorf("Unreachable: %v", err)
	}
}

func TestCheckOptions(t *testing.T) {
	const c Checker = "somestore"
	if err := c.CheckOptions(url.Values{"a": {"1"}, "b": {"2"}}, "a", "b", "c"); err != nil {
		t.Fatalf("known options: %v", err)
	}
	err := c.CheckOptions(url.Values{"a": {"1"}, "zz": {"2"}, "yy": {"3"}}, "a", "b")
	if !errors.Is(err, stores.ErrUnknownOption) || !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("error %v does not wrap ErrUnknownOption and ErrInvalid", err)
	}
	if want := `reqlock: invalid argument: somestore: unknown URL option "yy" (known: a, b)`; err.Error() != want {
		t.Errorf("error %q, want %q (the first unknown option, sorted)", err, want)
	}
	var uerr *UnknownOptionError
	if !errors.As(err, &uerr) || uerr.Store != c || uerr.Option != "yy" {
		t.Errorf("error %#v, want an UnknownOptionError for somestore, yy", err)
	}
	if err := c.CheckOptions(url.Values{"x": nil}); err == nil || !strings.HasSuffix(err.Error(), "(known: none)") {
		t.Errorf("no known options: error %v, want one ending (known: none)", err)
	}
}

func TestReservedToken(t *testing.T) {
	const c Checker = "teststore"
	for _, token := range []string{"\x00", "\x00reqlock:record:x"} {
		if err := c.CheckGrantToken(token, "\x00"); !errors.Is(err, stores.ErrInvalid) || !strings.HasPrefix(err.Error(), stores.ErrInvalid.Error()+": teststore: ") {
			t.Errorf("CheckGrantToken(%q) = %v, want ErrInvalid from teststore", token, err)
		}
		if err := c.CheckHeldToken([]string{"k"}, token, "\x00"); !errors.Is(err, stores.ErrNotHeld) || !strings.Contains(err.Error(), `"k"`) {
			t.Errorf("CheckHeldToken(%q) = %v, want ErrNotHeld naming the key", token, err)
		}
	}
	for _, token := range []string{"t", "a\x00", ""} {
		if err := c.CheckGrantToken(token, "\x00"); err != nil {
			t.Errorf("CheckGrantToken(%q) = %v, want nil", token, err)
		}
		if err := c.CheckHeldToken([]string{"k"}, token, "\x00"); err != nil {
			t.Errorf("CheckHeldToken(%q) = %v, want nil", token, err)
		}
	}
}
