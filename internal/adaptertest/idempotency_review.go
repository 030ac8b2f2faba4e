package adaptertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
)

// backends are the stores the idempotency tests that exercise the
// recording run on.
var backends = map[string]func(*testing.T) *reqlock.Locker{"memstore": memLockerFor, "redis": redisLockerFor}

// exchange sends a POST to path with the idempotency key key through a
// real connection to srv, and returns the response as it came on the wire
// (status, transfer encoding, headers less Date and Idempotent-Replayed,
// body) and whether it was a replay.
func exchange(t *testing.T, srv *httptest.Server, path, key string) (string, bool) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	replayed := resp.Header.Get(middleware.ReplayedHeader) == "true"
	resp.Header.Del("Date")
	resp.Header.Del(middleware.ReplayedHeader)
	var b strings.Builder
	b.WriteString(resp.Status + " " + strings.Join(resp.TransferEncoding, ",") + "\n")
	_ = resp.Header.Write(&b)
	b.WriteString("\r\n")
	b.Write(body)
	return b.String(), replayed
}

// testIdempotencyHijacked: a handler that hijacks the connection is not
// recorded, whatever the adapter's writer (gin's own Hijack included): a
// retry runs it again rather than replaying an empty 200.
func (s *suite) testIdempotencyHijacked(t *testing.T) {
	for backend, newLocker := range backends {
		t.Run(backend, func(t *testing.T) {
			locker := newLocker(t)
			var runs atomic.Int32
			h := func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				conn, buf, err := w.(http.Hijacker).Hijack()
				if err != nil {
					t.Errorf("%s: hijack: %v", s.a.Name, err)
					return
				}
				defer conn.Close()
				_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nhijacked")
				_ = buf.Flush()
			}
			srv := httptest.NewServer(s.serve(t, locker, "item:<id>", h,
				middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired}),
				middleware.WithLogger(discardLogger())))
			defer srv.Close()
			for i := range 2 {
				got, replayed := exchange(t, srv, "/items/1", "k-hijack")
				if replayed || !strings.HasSuffix(got, "\nhijacked") {
					t.Fatalf("%s: request %d got (replayed %v)\n%s\nwant the hijacked connection's answer", s.a.Name, i, replayed, got)
				}
			}
			if n := runs.Load(); n != 2 {
				t.Fatalf("%s: the handler ran %d times, want 2: a hijacked response must not be recorded", s.a.Name, n)
			}
			// The client has its answer before the handler returns: the
			// key is free once the middleware is done.
			lock, err := locker.Obtain(context.Background(), "item:1", time.Second, 30*time.Second)
			if err != nil {
				t.Fatalf("%s: the key stayed held: %v", s.a.Name, err)
			}
			_ = lock.Release(context.Background())
		})
	}
}

// testIdempotencyContentType: a replay carries the Content-Type the first
// answer carried when the handler set none, byte for byte: net/http sniffs
// it from what was written before the header went out, which a flush cuts
// short, and sends none when the handler set the field to nil.
func (s *suite) testIdempotencyContentType(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"flushed after blanks", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("  "))
			_ = http.NewResponseController(w).Flush()
			_, _ = w.Write([]byte("<html><body>hi</body></html>"))
		}},
		{"flushed before the body", func(w http.ResponseWriter, r *http.Request) {
			_ = http.NewResponseController(w).Flush()
			_, _ = w.Write([]byte("<html><body>hi</body></html>"))
		}},
		{"no Content-Type by a nil field", func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = nil
			_, _ = w.Write([]byte("<html><body>hi</body></html>"))
		}},
		{"sniffed", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("<html><body>hi</body></html>"))
		}},
	} {
		for backend, newLocker := range backends {
			t.Run(tc.name+"/"+backend, func(t *testing.T) {
				locker := newLocker(t)
				var runs atomic.Int32
				h := func(w http.ResponseWriter, r *http.Request) { runs.Add(1); tc.h(w, r) }
				srv := httptest.NewServer(s.serve(t, locker, "item:<id>", h,
					middleware.WithIdempotency(middleware.Idempotency{Mode: middleware.IdempotencyRequired})))
				defer srv.Close()
				first, _ := exchange(t, srv, "/items/1", "k-ct")
				got, replayed := exchange(t, srv, "/items/1", "k-ct")
				// A replay is written at once: Content-Length instead of
				// chunks is framing, not the answer.
				if _, content, ok := strings.Cut(first, "\n\r\n"); ok && strings.HasPrefix(first, "200 OK chunked\n") {
					first = strings.Replace(first, "200 OK chunked\n", fmt.Sprintf("200 OK \nContent-Length: %d\r\n", len(content)), 1)
				}
				if !replayed || got != first || runs.Load() != 1 {
					t.Fatalf("%s: replay (replayed %v, runs %d)\n%s\nwant the first answer\n%s", s.a.Name, replayed, runs.Load(), got, first)
				}
			})
		}
	}
}
