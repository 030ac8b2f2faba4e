package ginlock_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
	"github.com/reqlock/reqlock/stores/redisstore"
)

// TestIdempotencyHeaderSentEarly: a gin handler that sends its header with
// WriteHeaderNow (as c.AbortWithStatus does) and sets a header after it is
// recorded with the headers that went out: the late one was never sent, so
// a replay does not send it either.
func TestIdempotencyHeaderSentEarly(t *testing.T) {
	store, err := redisstore.New(testredis.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, locker := range map[string]*reqlock.Locker{
		"memstore": reqlock.MustNew(memstore.New()),
		"redis":    reqlock.MustNew(store, reqlock.WithKeyPrefix(testredis.Prefix(t))),
	} {
		t.Run(name, func(t *testing.T) {
			runs := 0
			r := gin.New()
			r.POST("/items/:id", ginlock.Must(ginlock.FromSpec(locker, "@lock key=item:<id> idempotency=required")), func(c *gin.Context) {
				runs++
				c.Header("X-Early", "1")
				c.Status(http.StatusCreated)
				c.Writer.WriteHeaderNow()
				c.Header("X-Late", "never sent")
			})
			srv := httptest.NewServer(r)
			defer srv.Close()
			for i := range 2 {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/items/1", strings.NewReader("x"))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", "k")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				h := resp.Header
				if resp.StatusCode != http.StatusCreated || h.Get("X-Early") != "1" || h.Get("X-Late") != "" ||
					(h.Get(middleware.ReplayedHeader) == "true") != (i > 0) {
					t.Fatalf("request %d: %d %v, want 201 with X-Early and without X-Late (replayed on the second)", i, resp.StatusCode, h)
				}
			}
			if runs != 1 {
				t.Fatalf("the handler ran %d times, want 1", runs)
			}
		})
	}
}
