package ginlock_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestIdempotencyGinNative: a handler in gin's own style (a status set
// before the body, c.JSON, c.AbortWithStatus, headers set after c.Status)
// is recorded as gin sent it, and replayed with the same status, headers
// and bytes, without running again; the table install records too.
func TestIdempotencyGinNative(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	runs := 0
	handlers := map[string]gin.HandlerFunc{
		"/json/:id": func(c *gin.Context) {
			runs++
			c.Status(http.StatusAccepted)
			c.Header("X-Late", "after-status")
			c.JSON(http.StatusCreated, gin.H{"id": c.Param("id")})
		},
		"/abort/:id": func(c *gin.Context) {
			runs++
			c.Header("X-Why", "gone")
			c.AbortWithStatus(http.StatusGone)
		},
	}
	rt := adaptertest.Table(t, locker, "POST /abort/{id}", "key=item:<id> idempotency=required")
	r := gin.New()
	if err := ginlock.Install(r, rt); err != nil {
		t.Fatal(err)
	}
	r.POST("/json/:id", ginlock.Must(ginlock.FromSpec(locker, "@lock key=item:<id> idempotency=required")), handlers["/json/:id"])
	r.POST("/abort/:id", handlers["/abort/:id"]) // locked and recorded by the table
	if err := ginlock.Verify(r, rt); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, status, header, body string }{
		{"/json/1", "201", "X-Late: after-status", `{"id":"1"}`},
		{"/abort/1", "410", "X-Why: gone", ``},
	} {
		runs = 0
		var first string
		for i := range 3 {
			req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader("b"))
			req.Header.Set("Idempotency-Key", "k"+tc.path)
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, req)
			got := rec.Result().Status[:3] + " " + rec.Body.String()
			name, value, _ := strings.Cut(tc.header, ": ")
			if got != tc.status+" "+tc.body || rec.Header().Get(name) != value {
				t.Fatalf("%s #%d: %q %v, want %s %q with %s", tc.path, i, got, rec.Header(), tc.status, tc.body, tc.header)
			}
			if replayed := rec.Header().Get(middleware.ReplayedHeader) == "true"; replayed != (i > 0) {
				t.Fatalf("%s #%d: replayed=%v", tc.path, i, replayed)
			}
			if i == 0 {
				first = got
			} else if got != first {
				t.Fatalf("%s: replay %q differs from the first answer %q", tc.path, got, first)
			}
		}
		if runs != 1 {
			t.Fatalf("%s: the handler ran %d times, want 1", tc.path, runs)
		}
	}
}
