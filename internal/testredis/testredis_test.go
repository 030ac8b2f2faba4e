package testredis

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func TestClientPings(t *testing.T) {
	c := Client(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	first := Addr(t)
	if second := Addr(t); first != second {
		t.Fatalf("Addr changed between calls: %s then %s", first, second)
	}
}

func TestPrefixUniqueAndSanitised(t *testing.T) {
	t.Run("a/b {c}", func(t *testing.T) {
		p1, p2 := Prefix(t), Prefix(t)
		if p1 == p2 {
			t.Fatalf("two prefixes are equal: %q", p1)
		}
		if strings.ContainsAny(p1, "/{} ") {
			t.Fatalf("prefix %q is not sanitised", p1)
		}
		if !strings.HasPrefix(p1, "test:TestPrefixUniqueAndSanitised_a_b__c_:") || !strings.HasSuffix(p1, ":") {
			t.Fatalf("prefix %q does not name the test", p1)
		}
	})
}

func TestDownClientFailsQuickly(t *testing.T) {
	c := DownClient(t)
	start := time.Now()
	err := c.Ping(context.Background()).Err()
	if err == nil {
		t.Fatal("PING to a down store succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("PING to a down store took %v", d)
	}
}

func TestStalledAddrNeverAnswers(t *testing.T) {
	c := redis.NewClient(&redis.Options{
		Addr:        StalledAddr(t),
		ReadTimeout: 100 * time.Millisecond,
		MaxRetries:  -1,
	})
	defer c.Close()
	start := time.Now()
	err := c.Ping(context.Background()).Err()
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("PING to a stalled store: got %v, want a timeout", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("PING to a stalled store took %v", d)
	}
}
