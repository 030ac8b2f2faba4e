package ginlock_test

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/ginlock"
	"github.com/reqlock/reqlock/internal/adaptertest"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// lockedBuffer is a log destination safe for the engine's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// earlyGroupTable is a table with a route in a group created before
// Install (/api), one created after it (/v2) and one on the engine.
func earlyGroupTable(t *testing.T, opts ...middleware.Option) *middleware.Routes {
	return adaptertest.TableWith(t, reqlock.MustNew(memstore.New()), opts,
		"POST /api/items/{id}", "key=item:<id>",
		"POST /v2/items/{id}", "key=item:<id>",
		"POST /items/{id}", "key=item:<id>")
}

// A group created before Install copies the engine's handlers without the
// table, so its routes would run unlocked: Verify names each such entry,
// at start-up (issue 20, item 6). Routes without an entry, in the same
// group, are no problem, and neither are groups created after Install.
func TestVerifyGroupBeforeInstall(t *testing.T) {
	rt := earlyGroupTable(t)
	r := gin.New()
	api := r.Group("/api") // too early
	if err := ginlock.Install(r, rt); err != nil {
		t.Fatal(err) // gin lists no groups: Install cannot see api
	}
	api.POST("/items/:id", lockKeys)
	api.GET("/items/:id", lockKeys) // no entry: unlocked by design
	r.Group("/v2").POST("/items/:id", lockKeys)
	r.POST("/items/:id", lockKeys)

	// Why: the early group's route really runs unlocked.
	if rec := adaptertest.Do(r, http.MethodPost, "/api/items/1"); rec.Body.String() != "unlocked" {
		t.Fatalf("POST /api/items/1 in a group created before Install: %d %q; gin no longer copies the "+
			"engine's handlers into a group (revisit Verify)", rec.Code, rec.Body)
	}

	err := ginlock.Verify(r, rt)
	if !errors.Is(err, middleware.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "code:1: POST /api/items/{id} runs unlocked") {
		t.Fatalf("Verify: got %v, want ErrInvalidConfig naming code:1 POST /api/items/{id}", err)
	}
	for _, ok := range []string{"/v2/", "GET", "code:3"} {
		if strings.Contains(err.Error(), ok) {
			t.Errorf("Verify names a route that runs the table or has no entry (%s): %v", ok, err)
		}
	}
}

// The same install checks the chains at its first request: the early
// group's route still runs unlocked (the table is not in its chain), but
// every request through the install is answered 500, and the problem is
// logged once, naming the entry.
func TestInstallFirstRequestFindsGroupBeforeInstall(t *testing.T) {
	var logs lockedBuffer
	rt := earlyGroupTable(t, middleware.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	r := gin.New()
	api := r.Group("/api")
	if err := ginlock.Install(r, rt); err != nil {
		t.Fatal(err)
	}
	api.POST("/items/:id", lockKeys)
	r.Group("/v2").POST("/items/:id", lockKeys)
	r.POST("/items/:id", lockKeys)
	for range 2 {
		for _, path := range []string{"/items/1", "/v2/items/1"} {
			if rec := adaptertest.Do(r, http.MethodPost, path); rec.Code != http.StatusInternalServerError {
				t.Fatalf("POST %s through a broken install: %d %q, want 500", path, rec.Code, rec.Body)
			}
		}
	}
	l := logs.String()
	if strings.Count(l, "install is broken") != 1 || !strings.Contains(l, "code:1: POST /api/items/{id} runs unlocked") {
		t.Fatalf("the broken install was not logged once naming code:1 POST /api/items/{id}: %s", l)
	}
}

// Groups created after Install, nested ones included, run the table:
// Verify passes and their routes are locked.
func TestVerifyGroupsAfterInstall(t *testing.T) {
	rt := adaptertest.Table(t, reqlock.MustNew(memstore.New()),
		"POST /api/items/{id}", "key=item:<id>",
		"PUT /api/v2/files/{path...}", "key=file:<path>",
		"POST /items/{id}", "key=item:<id>")
	r := gin.New()
	if err := ginlock.Install(r, rt); err != nil {
		t.Fatal(err)
	}
	api := r.Group("/api", func(c *gin.Context) { c.Next() })
	api.POST("/items/:id", lockKeys)
	api.GET("/items/:id", lockKeys)
	api.Group("/v2").PUT("/files/*path", lockKeys)
	r.POST("/items/:id", lockKeys)
	r.GET("/health", lockKeys)
	if err := ginlock.Verify(r, rt); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	for _, c := range []struct{ method, path, want string }{
		{http.MethodPost, "/api/items/1", "item:1"},
		{http.MethodGet, "/api/items/1", "unlocked"},
		{http.MethodPut, "/api/v2/files/a", "file:a"},
		{http.MethodPost, "/items/2", "item:2"},
		{http.MethodGet, "/health", "unlocked"},
	} {
		if rec := adaptertest.Do(r, c.method, c.path); rec.Code != http.StatusOK || rec.Body.String() != c.want {
			t.Errorf("%s %s: %d %q, want 200 %q", c.method, c.path, rec.Code, rec.Body, c.want)
		}
	}
}

// Verify without Install names every entry, and reports an entry that
// matches no route as CheckRoutes does; it refuses nil arguments.
func TestVerifyWithoutInstall(t *testing.T) {
	rt := adaptertest.Table(t, reqlock.MustNew(memstore.New()),
		"POST /items/{id}", "key=item:<id>",
		"PUT /itmes/{id}", "key=item:<id>")
	r := gin.New()
	r.POST("/items/:id", lockKeys)
	err := ginlock.Verify(r, rt)
	for _, want := range []string{"code:1: POST /items/{id} runs unlocked", "code:2: PUT /itmes/{id} matches no registered route"} {
		if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("Verify without Install: got %v, want ErrInvalidConfig with %q", err, want)
		}
	}
	if err := ginlock.Verify(nil, rt); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Errorf("Verify(nil, rt): got %v, want ErrInvalidConfig", err)
	}
	if err := ginlock.Verify(r, nil); !errors.Is(err, middleware.ErrInvalidConfig) {
		t.Errorf("Verify(r, nil): got %v, want ErrInvalidConfig", err)
	}
}
