package middleware_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/middleware"
	"github.com/reqlock/reqlock/stores/memstore"
)

// A handler of a route locked on two body fields finds each key's fence by
// the value it came from, with keyfunc.Render, although the stored keys are
// escaped ("A-1" is stored as "acct:A%2D1"): the newcomer's /transfer.
func TestHandlerFindsFencesByValue(t *testing.T) {
	from := keyfunc.MustParse("acct:<json:from>")
	to := keyfunc.MustParse("acct:<json:to>")
	cfg := middleware.DefaultConfig
	cfg.Keys = []string{"acct:<json:from>", "acct:<json:to>"}
	guard, err := middleware.NewWithConfig(reqlock.MustNew(memstore.New()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	type transfer struct{ From, To string }
	var fences [2]int64
	var naive bool
	h := guard.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req transfer
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		lock, ok := reqlock.FromContext(r.Context())
		if !ok {
			http.Error(w, "no lock", http.StatusInternalServerError)
			return
		}
		_, naive = lock.FenceOf("acct:" + req.From)
		for i, p := range []struct {
			tmpl  *keyfunc.Template
			value string
		}{{from, req.From}, {to, req.To}} {
			key, err := p.tmpl.Render(p.value)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fence, ok := lock.FenceOf(key)
			if !ok {
				http.Error(w, "no fence for "+key, http.StatusInternalServerError)
				return
			}
			fences[i] = fence
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/transfer", strings.NewReader(`{"from":"A-1","to":"B-2"}`)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if naive {
		t.Fatal(`FenceOf("acct:A-1") found a fence: the stored key is no longer escaped, and this test no longer shows why Render is needed`)
	}
	if fences[0] <= 0 || fences[1] <= 0 {
		t.Fatalf("fences %v, want both positive", fences)
	}
}
