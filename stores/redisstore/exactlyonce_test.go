package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// deductScript takes 1 from KEYS[1] and records the request in the same
// step, when the request's claim holds the record key KEYS[2]: 0 and
// nothing changed when it does not.
var deductScript = redis.NewScript(redisstore.RecordLua + `
if not reqlock_claimed(KEYS[2], ARGV[1]) then
  return 0
end
redis.call('DECR', KEYS[1])
reqlock_record(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
return 1
`)

func runDeduct(ctx context.Context, client redis.Scripter, stock string, w redisstore.RecordWrite) (int64, error) {
	return deductScript.Run(ctx, client, []string{stock, w.Key, w.WaitingKey}, w.Token, w.Value, w.RetentionMS).Int64()
}

// newStore returns a Store on client, closed when the test ends.
func newStore(t *testing.T, client redis.Scripter) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// claimForScript claims the record key prefix+"rec" for the token "tok" for
// a minute on s, for a script to record in: it returns the key, the key
// prefix+"stock" for the script to deduct from, and the claim's fence.
func claimForScript(t *testing.T, s *redisstore.Store, prefix string) (key, stock string, fence int64) {
	t.Helper()
	key, stock = prefix+"rec", prefix+"stock"
	g, _, err := s.ClaimRecord(context.Background(), key, "tok", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	return key, stock, g.Fences[0]
}

// TestRecordWriteInScript: a script that records with RecordWrite leaves
// the record ClaimRecord returns; FinishRecord of the same token then
// answers nil and changes nothing; a script of another token, or after the
// claim was released, changes nothing.
func TestRecordWriteInScript(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	prefix := testredis.Prefix(t)
	key, stock, fence := claimForScript(t, s, prefix)
	rec := stores.Record{Fingerprint: "fp", Response: []byte("first"), Fence: fence}
	if _, err := redisstore.NewRecordWrite(key, "other", rec, 0); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("NewRecordWrite with retention 0: %v, want ErrInvalid", err)
	}
	other, err := redisstore.NewRecordWrite(key, "other", rec, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := runDeduct(ctx, client, stock, other); err != nil || n != 0 {
		t.Fatalf("script of another token: %d, %v; want 0", n, err)
	}
	w, err := redisstore.NewRecordWrite(key, "tok", rec, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := runDeduct(ctx, client, stock, w); err != nil || n != 1 {
		t.Fatalf("script of the claim's token: %d, %v; want 1", n, err)
	}
	if n, err := runDeduct(ctx, client, stock, w); err != nil || n != 0 {
		t.Fatalf("the script again: %d, %v; want 0 (the key holds the record, not the claim)", n, err)
	}
	if err := s.FinishRecord(ctx, key, "tok", stores.Record{Fingerprint: "fp", Response: []byte("second")}, time.Minute); err != nil {
		t.Fatalf("FinishRecord of the same token after the script: %v, want nil", err)
	}
	if err := s.FinishRecord(ctx, key, "other", rec, time.Minute); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("FinishRecord of another token: %v, want ErrNotHeld", err)
	}
	_, got, err := s.ClaimRecord(ctx, key, "late", time.Minute)
	if err != nil || got == nil || string(got.Response) != "first" || got.Fingerprint != "fp" || got.Fence != rec.Fence {
		t.Fatalf("the record: %+v, %v; want the script's", got, err)
	}
	if v, err := client.Get(ctx, stock).Int64(); err != nil || v != -1 {
		t.Fatalf("stock %d, %v; want -1 (one deduction)", v, err)
	}
	if ttl := client.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("the record's TTL is %v, want the retention", ttl)
	}
	// A released claim: the script changes nothing.
	key2 := prefix + "rec2"
	if g, _, err := s.ClaimRecord(ctx, key2, "tok", time.Minute); err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	if err := s.Release(ctx, []string{key2}, "tok", 0); err != nil {
		t.Fatal(err)
	}
	w2, _ := redisstore.NewRecordWrite(key2, "tok", rec, time.Minute)
	if n, err := runDeduct(ctx, client, stock, w2); err != nil || n != 0 {
		t.Fatalf("script after the release: %d, %v; want 0", n, err)
	}
}

// TestIdempotentRequestRecordsInScript runs a route whose handler deducts
// and records in one script (middleware.IdempotencyOf), then answers 503 as
// if the script's outcome were unknown: the retry replays the recorded 200,
// byte for byte what a handler that answers it writes, and the stock fell
// once. A second key whose handler answers the 200 it recorded is replayed
// with the same bytes it wrote.
func TestIdempotentRequestRecordsInScript(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	prefix := testredis.Prefix(t)
	locker, err := reqlock.New(s, reqlock.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	g, err := middleware.New(locker, "item:<header:X-Item>", middleware.WithName("deduct"),
		middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired}))
	if err != nil {
		t.Fatal(err)
	}
	stock := prefix + "stock"
	runs := 0
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		idem, ok := middleware.IdempotencyOf(r)
		if !ok {
			t.Error("IdempotencyOf: no request")
			return
		}
		if lock, _ := reqlock.FromContext(r.Context()); lock == nil || lock.Key() != "item:"+r.Header.Get("X-Item") {
			t.Errorf("the handler's lock is %v, want the route's", lock)
		}
		body := []byte(`{"deducted":` + strconv.Itoa(runs) + "}\n")
		header := http.Header{"Content-Type": {"application/json"}, "X-Run": {strconv.Itoa(runs)}}
		if _, err := idem.Record(http.StatusServiceUnavailable, header, body); !errors.Is(err, middleware.ErrNotRecordable) {
			t.Errorf("Record of a 503: %v, want ErrNotRecordable", err)
		}
		rec, err := idem.Record(http.StatusOK, header, body)
		if err != nil {
			t.Error(err)
			return
		}
		rw, err := redisstore.NewRecordWrite(idem.Key, idem.Token, rec, idem.Retention)
		if err != nil {
			t.Error(err)
			return
		}
		if n, err := runDeduct(r.Context(), client, stock, rw); err != nil || n != 1 {
			t.Errorf("script: %d, %v", n, err)
		}
		if r.Header.Get("X-Lie") != "" { // as if the script's answer were lost
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	}))
	do := func(item, key string, lie bool) (int, http.Header, []byte) {
		req := httptest.NewRequest(http.MethodPost, "/deduct", strings.NewReader(`{"qty":1}`))
		req.Header.Set("X-Item", item)
		req.Header.Set("Idempotency-Key", key)
		if lie {
			req.Header.Set("X-Lie", "1")
		}
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		b, _ := io.ReadAll(rr.Result().Body)
		return rr.Code, rr.Result().Header, b
	}
	if code, _, _ := do("a", "k1", true); code != http.StatusServiceUnavailable {
		t.Fatalf("first answer %d, want the handler's 503", code)
	}
	code, hdr, body := do("a", "k1", false)
	if code != http.StatusOK || string(body) != "{\"deducted\":1}\n" || hdr.Get(middleware.ReplayedHeader) != "true" ||
		hdr.Get("X-Run") != "1" || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("retry after the 503: %d %v %q; want the recorded 200, replayed", code, hdr, body)
	}
	code1, hdr1, body1 := do("b", "k2", false)
	code2, hdr2, body2 := do("b", "k2", false)
	if code1 != http.StatusOK || code2 != code1 || !bytes.Equal(body1, body2) || hdr2.Get("X-Run") != hdr1.Get("X-Run") ||
		hdr2.Get(middleware.ReplayedHeader) != "true" || hdr1.Get(middleware.ReplayedHeader) != "" {
		t.Fatalf("first %d %v %q, replay %d %v %q: want the same answer", code1, hdr1, body1, code2, hdr2, body2)
	}
	if runs != 2 {
		t.Fatalf("the handler ran %d times, want 2 (once per key)", runs)
	}
	if v, err := client.Get(context.Background(), stock).Int64(); err != nil || v != -2 {
		t.Fatalf("stock %d, %v; want -2 (once per key)", v, err)
	}
}
