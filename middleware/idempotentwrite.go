package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/stores"
)

// ErrNotRecordable is the error of IdempotentRequest.Record for a response
// the middleware would not record: its status is not recorded (a 5xx, 401,
// 408, 423, 425 or 429), its body is over the route's max body, or its
// header fields are over MaxRecordedHeaderBytes.
var ErrNotRecordable = errors.New("reqlock/middleware: the response is not recorded")

// IdempotentRequest is what the handler of a request with an idempotency
// key needs to write the request's record itself, in the same atomic step as
// its own write (a Lua script of the Redis that holds both its data and the
// Locker's keys, say), so that a retry after an unknown outcome gets the
// first answer instead of running again. See IdempotencyOf, and "Exactly
// once" in docs/idempotency.md.
//
// The handler's atomic step must check that Key still holds Token (the
// claim is this request's) before it changes anything, and then replace
// Key's value by the record; redisstore.NewRecordWrite gives a Lua script
// what it needs for both. The middleware then finishes the claim as usual:
// FinishRecord of the same token answers nil on a key that holds the record
// this token wrote, and changes nothing, so the record stays the handler's.
type IdempotentRequest struct {
	// Key is the record key as the store holds it: the Locker's key
	// prefix, reqlock.RecordKeyPrefix, the route's name and a hash of the
	// scope and the idempotency key.
	Key string
	// Token is the claim's token, the value of Key while the claim holds
	// it.
	Token string
	// Fence is the claim's fence, which the record keeps.
	Fence int64
	// Fingerprint is the request's fingerprint, which the record keeps.
	Fingerprint string
	// Retention is the route's: how long the record is kept.
	Retention time.Duration

	rc *Recording
}

// IdempotencyOf returns the IdempotentRequest of r, a request that a route
// with idempotency runs with an idempotency key, and false for any other
// request (no key on an optional route, a route without idempotency).
func IdempotencyOf(r *http.Request) (*IdempotentRequest, bool) {
	rc, _ := r.Context().Value(recordingKey{}).(*Recording)
	if rc == nil || rc.idem == nil {
		return nil, false
	}
	return rc.idem, true
}

// Record returns the record of the response the handler is about to write,
// exactly as the middleware would record it: status, the header fields the
// handler sets on the response (those that were there before it ran are
// left out, as in the middleware's records) and the body. The handler must
// then write that same response. It returns an error wrapping
// ErrNotRecordable for a response the middleware would not record.
//
// The middleware compares the response the handler wrote with the last
// record Record returned, and logs a mismatch at Warn: a replay gives what
// the handler recorded.
func (ir *IdempotentRequest) Record(status int, header http.Header, body []byte) (stores.Record, error) {
	rc := ir.rc
	switch {
	case !recordedStatus(status):
		return stores.Record{}, fmt.Errorf("%w: status %d", ErrNotRecordable, status)
	case int64(len(body)) > rc.g.idem.cfg.MaxBodyBytes:
		return stores.Record{}, fmt.Errorf("%w: a body of %d bytes is over the route's max body of %d", ErrNotRecordable,
			len(body), rc.g.idem.cfg.MaxBodyBytes)
	}
	full := rc.before.Clone()
	for name, values := range header {
		full[http.CanonicalHeaderKey(name)] = values
	}
	resp, ok := encodeResponse(status, recordedHeader(rc.before, full), body)
	if !ok {
		return stores.Record{}, fmt.Errorf("%w: the header fields are over %d bytes", ErrNotRecordable, MaxRecordedHeaderBytes)
	}
	rc.mu.Lock()
	rc.declared = resp
	rc.mu.Unlock()
	return stores.Record{Fingerprint: ir.Fingerprint, Response: resp, Fence: ir.Fence}, nil
}

// newIdempotentRequest returns the IdempotentRequest of a request whose
// claim is claim, recorded by rc.
func newIdempotentRequest(rc *Recording, claim *reqlock.Lock, fp string) *IdempotentRequest {
	return &IdempotentRequest{Key: claim.StoreKey(), Token: claim.Token(), Fence: claim.Fence(), Fingerprint: fp,
		Retention: rc.g.idem.cfg.Retention, rc: rc}
}
