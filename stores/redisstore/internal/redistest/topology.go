package redistest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/storetest"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// Dial dials a server's address, as ProxiedDialer's function does.
type Dial = func(ctx context.Context, network, addr string) (net.Conn, error)

// Conformance runs the conformance suite on stores of client, with every
// capability a redisstore.Store declares; proxied returns a client of the
// same servers through fault proxies, one per server.
func Conformance[C any](t *testing.T, client C, newStore func(testing.TB, C) stores.Store, proxied func(*testing.T) (C, []*faultproxy.Proxy)) {
	storetest.Run(t, storetest.Suite{
		New:     func(t *testing.T) stores.Store { return newStore(t, client) },
		Notify:  true,
		Fair:    true,
		Shared:  true,
		Records: true,
		Proxied: func(t *testing.T) (stores.Store, []*faultproxy.Proxy) {
			c, proxies := proxied(t)
			return newStore(t, c), proxies
		},
	})
}

// Clients makes one client library's clients and stores of a topology.
type Clients[C any] struct {
	// New returns a client of the topology's servers, closed when the test
	// ends; with dial, it reaches every server through dial.
	New func(t testing.TB, dial Dial) C
	// Store returns a Store over client, closed when the test ends.
	Store func(t testing.TB, client C) stores.Store
}

// locker returns a Locker over a Store on a client of its own: one process
// of the service under load.
func (c Clients[C]) locker(t *testing.T) *reqlock.Locker {
	t.Helper()
	l, err := reqlock.New(c.Store(t, c.New(t, nil)), reqlock.WithKeyPrefix(LockerKeyPrefix))
	if err != nil {
		t.Fatalf("reqlock.New: %v", err)
	}
	return l
}

// Cluster runs the conformance suite through clients on a Redis Cluster
// (testservers.RedisCluster), its faults through a proxy in front of every
// node, then kills the master of a locked key's slot under load (see
// FailoverUnderLoad).
func Cluster[C any](t *testing.T, nodes []*testservers.Server, clients Clients[C]) {
	t.Run("Conformance", func(t *testing.T) {
		Conformance(t, clients.New(t, nil), clients.Store, func(t *testing.T) (C, []*faultproxy.Proxy) {
			dial, proxies := ProxiedDialer(t, testservers.Addrs(nodes))
			return clients.New(t, dial), proxies
		})
	})
	t.Run("FailoverUnderLoad", func(t *testing.T) {
		key := "topology:{" + rand.Text() + "}:sku"
		master, replica := SlotServers(t, nodes, LockerKeyPrefix+key)
		FailoverUnderLoad(t, Failover{
			Key:       key,
			NewLocker: clients.locker,
			Kill:      master.Kill,
			NewMaster: func() error { return RoleIs(replica.Addr(), "master") },
		})
	})
}

// Sentinel runs the conformance suite through clients on a Sentinel set
// (testservers.SentinelSet: master, replica, 3 Sentinels), its faults
// through a proxy in front of each data node (the Sentinels, which hold no
// lock, are reached directly), then kills the master under load (see
// FailoverUnderLoad).
func Sentinel[C any](t *testing.T, set *testservers.Sentinel, clients Clients[C]) {
	t.Run("Conformance", func(t *testing.T) {
		Conformance(t, clients.New(t, nil), clients.Store, func(t *testing.T) (C, []*faultproxy.Proxy) {
			dial, proxies := ProxiedDialer(t, testservers.Addrs(set.Redis), set.Addrs()...)
			return clients.New(t, dial), proxies
		})
	})
	t.Run("FailoverUnderLoad", func(t *testing.T) {
		if got, err := set.MasterAddr(); err != nil || got != set.Redis[0].Addr() {
			t.Fatalf("MasterAddr = %q, %v; want Redis[0] %s", got, err, set.Redis[0].Addr())
		}
		FailoverUnderLoad(t, Failover{
			Key:       "topology:{" + rand.Text() + "}:sku",
			NewLocker: clients.locker,
			Kill:      set.Redis[0].Kill,
			NewMaster: func() error {
				got, err := set.MasterAddr()
				if err == nil && got != set.Redis[1].Addr() {
					err = fmt.Errorf("the Sentinels' master is still %s", got)
				}
				return err
			},
		})
	})
}

// Opener is a driver package's Open.
type Opener[S stores.Store] func(ctx context.Context, rawURL string) (S, error)

// OpenUnreachable runs storetest.Startup on open with redis:// URLs of a
// proxy in front of addr (the test Redis): open fails at start-up while
// Redis cannot be reached, naming its address, unless connect=lazy, and a
// lazy Store works once Redis answers.
func OpenUnreachable[S stores.Store](t *testing.T, addr string, open Opener[S]) {
	p := faultproxy.New(t, addr)
	storetest.Startup(t, []*faultproxy.Proxy{p}, func(ctx context.Context, addrs []string, lazy bool) (stores.Store, error) {
		u := "redis://" + addrs[0] + "/0"
		if lazy {
			u += "?connect=lazy"
		}
		return open(ctx, u)
	})
}

// OpenRejects checks that open refuses each URL (and those Open refuses
// for every driver: a bad connect value, an unknown parameter, another
// scheme, for the Redis at addr) with an error wrapping stores.ErrInvalid
// that does not quote the URL's password.
func OpenRejects[S stores.Store](t *testing.T, addr string, open Opener[S], urls ...string) {
	t.Helper()
	urls = append(urls,
		"redis://"+addr+"/0?connect=maybe",
		"redis://u:secret@"+addr+"/0?no_such_option=1",
		"http://"+addr,
	)
	for _, bad := range urls {
		_, err := open(context.Background(), bad)
		if !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("Open(%q): got %v, want ErrInvalid", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): the error quotes the password: %v", bad, err)
		}
	}
}
