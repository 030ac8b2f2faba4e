package middleware_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestIdempotencyOf: a request with a key gets its IdempotentRequest (the
// record key with the Locker's prefix, the claim's token and fence), one
// without a key none; Record encodes what the middleware records, so that a
// handler that writes what it recorded logs nothing, and one that writes
// something else is logged at Warn; Record refuses what the middleware
// would not record.
func TestIdempotencyOf(t *testing.T) {
	logs := &lockedBuffer{}
	locker := reqlock.MustNew(memstore.New(), reqlock.WithKeyPrefix("shop:"))
	g, err := middleware.New(locker, "item", middleware.WithName("buy"), middleware.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyOptional, MaxBodyBytes: 100}))
	if err != nil {
		t.Fatal(err)
	}
	var got *middleware.IdempotentRequest
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idem, ok := middleware.IdempotencyOf(r)
		if !ok {
			got = nil
			w.Header().Set("X-Plain", "1")
			return
		}
		got = idem
		claim, _ := reqlock.FromContext(r.Context())
		if claim == nil || claim.Key() != "item" {
			t.Errorf("the handler's lock is %v, want the route's", claim)
		}
		if _, err := idem.Record(http.StatusInternalServerError, nil, nil); !errors.Is(err, middleware.ErrNotRecordable) {
			t.Errorf("Record of a 500: %v, want ErrNotRecordable", err)
		}
		if _, err := idem.Record(http.StatusOK, nil, make([]byte, 101)); !errors.Is(err, middleware.ErrNotRecordable) {
			t.Errorf("Record of a body over the max: %v, want ErrNotRecordable", err)
		}
		body := []byte("bought " + r.Header.Get("Idempotency-Key"))
		rec, err := idem.Record(http.StatusCreated, http.Header{"x-item": {"7"}}, body)
		if err != nil || rec.Fingerprint != idem.Fingerprint || rec.Fence != idem.Fence || len(rec.Response) == 0 {
			t.Errorf("Record: %+v, %v", rec, err)
		}
		w.Header().Set("X-Item", "7")
		w.WriteHeader(http.StatusCreated)
		if r.Header.Get("X-Other") != "" {
			body = []byte("something else")
		}
		_, _ = w.Write(body)
	}))
	do := func(key string, other bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/buy", strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if other {
			req.Header.Set("X-Other", "1")
		}
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr
	}
	if rr := do("", false); got != nil || rr.Header().Get("X-Plain") != "1" {
		t.Fatalf("without a key: IdempotencyOf gave %+v", got)
	}
	first := do("k1", false)
	if got == nil || !strings.HasPrefix(got.Key, "shop:"+reqlock.RecordKeyPrefix+"{") || !strings.HasSuffix(got.Key, "}:buy") || got.Token == "" || got.Fence == 0 ||
		len(got.Fingerprint) != 64 || got.Retention != middleware.DefaultIdempotencyRetention {
		t.Fatalf("IdempotentRequest %+v", got)
	}
	replay := do("k1", false)
	if first.Code != http.StatusCreated || replay.Code != first.Code || replay.Body.String() != first.Body.String() ||
		replay.Header().Get("X-Item") != "7" || replay.Header().Get(middleware.ReplayedHeader) != "true" {
		t.Fatalf("first %d %v %q, replay %d %v %q", first.Code, first.Header(), first.Body, replay.Code, replay.Header(), replay.Body)
	}
	if strings.Contains(logs.String(), "differs") {
		t.Fatalf("a handler that wrote what it recorded was logged:\n%s", logs)
	}
	do("k2", true)
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "differs from the one it wrote") {
		t.Fatalf("a handler that wrote something else than it recorded was not logged at Warn:\n%s", logs)
	}
}
