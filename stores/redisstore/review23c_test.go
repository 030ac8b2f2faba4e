package redisstore_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
	"github.com/reqlock/reqlock/stores/storetest/faultproxy"
)

// resentScript is docs/idempotency.md's script: 1 when it deducted and
// recorded, or when the key holds its record already (it ran, and was
// resent); 0, changing nothing, when the claim was lost.
var resentScript = redis.NewScript(redisstore.RecordLua + `
if not reqlock_claimed(KEYS[2], ARGV[1]) then
  if reqlock_recorded(KEYS[2], ARGV[2]) then return 1 end
  return 0
end
redis.call('DECR', KEYS[1])
reqlock_record(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
return 1
`)

// TestReview23cResentRecordScript: a script that records runs, its reply is
// lost with its connection, and go-redis (default retries) sends it again:
// reqlock_recorded lets the resent script answer as the first run did (1),
// and the stock fell once. A script of another record on that key (a
// request whose claim was lost to it) still answers 0.
func TestReview23cResentRecordScript(t *testing.T) {
	addr := testredis.Addr(t)
	proxy := faultproxy.New(t, addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	key, stock, fence := claimForScript(t, newStore(t, testredis.Client(t)), testredis.Prefix(t))
	w, err := redisstore.NewRecordWrite(key, "tok", stores.Record{Fingerprint: "fp", Response: []byte("first"), Fence: fence}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := resentScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	hash := []byte(resentScript.Hash())
	proxy.CutWhen(faultproxy.ToServer, func(chunk []byte) bool { return bytes.Contains(chunk, hash) }, true)
	n, err := resentScript.Run(ctx, client, []string{stock, w.Key, w.WaitingKey}, w.Token, w.Value, w.RetentionMS).Int()
	if proxy.Armed() != 0 {
		t.Fatal("the script's reply was not cut")
	}
	if err != nil || n != 1 {
		t.Fatalf("the resent script answered %d, %v; want 1: it ran, and recorded", n, err)
	}
	if v, err := client.Get(ctx, stock).Int64(); err != nil || v != -1 {
		t.Fatalf("stock %d, %v; want -1 (one deduction)", v, err)
	}
	other, err := redisstore.NewRecordWrite(key, "tok2", stores.Record{Fingerprint: "fp", Response: []byte("other")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := resentScript.Run(ctx, client, []string{stock, other.Key, other.WaitingKey}, other.Token, other.Value, other.RetentionMS).Int(); err != nil || n != 0 {
		t.Fatalf("a script of another token: %d, %v; want 0", n, err)
	}
}
