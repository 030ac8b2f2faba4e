package middleware

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/reqlock/reqlock/keyfunc"
)

// StatusClientClosedRequest is the status recorded when the client went away
// while its request waited. The client never sees it; it shows in access logs.
const StatusClientClosedRequest = 499

// Reason says why a request was rejected.
type Reason string

// The reasons a request is rejected.
const (
	// ReasonTimeout: the wait for a held key ran out (TimeoutStatus).
	ReasonTimeout Reason = "timeout"
	// ReasonLimit: on a route with a Limit, the wait for a place ran out
	// with every place taken (TimeoutStatus, 429 by default).
	ReasonLimit Reason = "limit"
	// ReasonStoreError: the lock store failed or timed out (503).
	ReasonStoreError Reason = "store_error"
	// ReasonBadKey: the key could not be derived from the request (400).
	ReasonBadKey Reason = "bad_key"
	// ReasonBodyTooLarge: the body needed for the key is too large (413).
	ReasonBodyTooLarge Reason = "body_too_large"
	// ReasonTooManyKeys: the request yields more keys than the route's
	// MaxKeys (413).
	ReasonTooManyKeys Reason = "too_many_keys"
	// ReasonCanceled: the client went away while waiting (499).
	ReasonCanceled Reason = "canceled"
	// ReasonLockLost: the request's own lock on a key it locks again (a
	// route inside a locked group) was lost (409).
	ReasonLockLost Reason = "lock_lost"
	// ReasonInternal: anything else (500).
	ReasonInternal Reason = "internal"
	// ReasonIdempotencyKeyMissing: a route with idempotency required got
	// no idempotency key (400).
	ReasonIdempotencyKeyMissing Reason = "idempotency_key_missing"
	// ReasonIdempotencyKeyInvalid: the idempotency key is empty, longer
	// than MaxIdempotencyKeyLen, not visible ASCII, or given twice (400).
	ReasonIdempotencyKeyInvalid Reason = "idempotency_key_invalid"
	// ReasonIdempotencyConflict: a request with the same idempotency key
	// was still running when the wait ended (409).
	ReasonIdempotencyConflict Reason = "idempotency_conflict"
	// ReasonIdempotencyMismatch: the idempotency key was used for a
	// different request (422).
	ReasonIdempotencyMismatch Reason = "idempotency_mismatch"
)

// Rejection describes a request that will not reach its handler.
type Rejection struct {
	// Status is the HTTP status to answer.
	Status int
	// Reason is why.
	Reason Reason
	// RetryAfter is the delay for the Retry-After header; zero sends none.
	RetryAfter time.Duration
	// Detail is a human-readable explanation, safe to show to clients: it
	// never holds request values or store addresses.
	Detail string
	// Err is the underlying error, for logs; it is not shown to clients.
	Err error
}

// Problem is an RFC 9457 problem details body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Reason is the Rejection's reason, for clients that branch on it.
	Reason Reason `json:"reason"`
}

// Problem returns the problem details body of the rejection.
func (r *Rejection) Problem() Problem {
	return Problem{
		Type:   "about:blank",
		Title:  statusTitle(r.Status),
		Status: r.Status,
		Detail: r.Detail,
		Reason: r.Reason,
	}
}

// RetryAfterHeader returns the Retry-After header value: whole seconds,
// rounded up, at least 1; or "" when RetryAfter is zero.
func (r *Rejection) RetryAfterHeader() string {
	if r.RetryAfter <= 0 {
		return ""
	}
	secs := int64((r.RetryAfter + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(secs, 1), 10)
}

// Responder writes a rejection. Set one per route to replace the default
// JSON problem details.
type Responder func(w http.ResponseWriter, r *http.Request, rej *Rejection)

// RequestResponder writes a rejection, seeing the request as the adapter
// does: req is the keyfunc.Request the adapter passes to Guard.Serve, from
// which an adapter's framework-native responder reads its context
// (ginlock.WithResponder, echolock.WithResponder). It may return an error
// for the adapter to pass on: echolock returns it to echo's error handler,
// ginlock adds it to c.Errors, net/http drops it.
type RequestResponder func(w http.ResponseWriter, req keyfunc.Request, rej *Rejection) error

// WriteProblem is the default Responder: it sets Retry-After when the
// rejection has one and writes the problem details as
// application/problem+json.
func WriteProblem(w http.ResponseWriter, _ *http.Request, rej *Rejection) {
	h := w.Header()
	if v := rej.RetryAfterHeader(); v != "" {
		h.Set("Retry-After", v)
	}
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(rej.Status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // keep "<json:sku>" readable; the type is not HTML
	_ = enc.Encode(rej.Problem())
}

func statusTitle(status int) string {
	switch status {
	case StatusClientClosedRequest:
		return "Client Closed Request"
	case http.StatusRequestEntityTooLarge:
		return "Content Too Large"
	case http.StatusUnprocessableEntity:
		return "Unprocessable Content"
	}
	return http.StatusText(status)
}
