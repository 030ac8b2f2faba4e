package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// TestMaxKeysCountsRepeats pins the documented rule: MaxKeys caps the keys
// the templates yield, repeats included, and the lock holds each distinct
// key once.
func TestMaxKeysCountsRepeats(t *testing.T) {
	locker := reqlock.MustNew(memstore.New())
	g, err := middleware.NewFromSpec(locker, "@lock key=sku:<json:items[*]> key=sku:<json:extra> max-keys=3")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	h := g.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lock, _ := reqlock.FromContext(r.Context())
		keys = lock.Keys()
	})
	cases := []struct {
		body     string
		status   int
		wantKeys []string
	}{
		{`{"items":["b","a"],"extra":"a"}`, http.StatusOK, []string{"sku:a", "sku:b"}},
		{`{"items":["b","a","b"],"extra":"c"}`, http.StatusRequestEntityTooLarge, nil},
		{`{"items":["a","b","c","a"],"extra":"a"}`, http.StatusRequestEntityTooLarge, nil},
	}
	for _, tc := range cases {
		keys = nil
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body)))
		if rec.Code != tc.status || !slices.Equal(keys, tc.wantKeys) {
			t.Errorf("%s: %d with keys %q, want %d with %q", tc.body, rec.Code, keys, tc.status, tc.wantKeys)
		}
		if tc.status == http.StatusRequestEntityTooLarge && !strings.Contains(rec.Body.String(), `"too_many_keys"`) {
			t.Errorf("%s: body %s lacks reason too_many_keys", tc.body, rec.Body)
		}
	}
}
