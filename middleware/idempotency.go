package middleware

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
	"github.com/reqlock/reqlock/stores"
)

// IdempotencyMode says whether a route's requests carry an idempotency key.
type IdempotencyMode int

const (
	// IdempotencyOff: the route records nothing (the default).
	IdempotencyOff IdempotencyMode = iota
	// IdempotencyOptional: a request with the key is recorded and
	// replayed; one without it runs as on a route without idempotency.
	IdempotencyOptional
	// IdempotencyRequired: a request without the key is answered 400.
	IdempotencyRequired
)

// String returns the mode as the spec language writes it: "off",
// "optional" or "required".
func (m IdempotencyMode) String() string {
	switch m {
	case IdempotencyOff:
		return "off"
	case IdempotencyOptional:
		return "optional"
	case IdempotencyRequired:
		return "required"
	}
	return fmt.Sprintf("IdempotencyMode(%d)", int(m))
}

// Idempotency configures a route's idempotency keys (the IETF draft "The
// Idempotency-Key HTTP Header Field"): the first request with a key runs
// and its response is recorded in the Locker's store for Retention; a
// retry with the same key and the same request gets the recorded response
// byte for byte, marked with the header Idempotent-Replayed: true, and the
// handler does not run. See docs/idempotency.md for the whole behaviour.
// A zero field takes its default; Mode is required.
type Idempotency struct {
	// Mode is IdempotencyOptional or IdempotencyRequired.
	Mode IdempotencyMode

	// Header is the request header that carries the key. Default
	// "Idempotency-Key".
	Header string

	// Retention is how long a response stays recorded. Default 24h.
	Retention time.Duration

	// Scope is a key template (package keyfunc's grammar) whose value sets
	// the keys of different clients apart, such as
	// "<header:Authorization>" or "<ctx:user>": the value is hashed with
	// the key, never stored. Add a scope when keys come from several
	// clients. Default none: one key space per route.
	Scope string

	// MaxBodyBytes is the largest response body recorded; a larger
	// response is not recorded, and a retry runs the handler again.
	// Default 64 KiB.
	MaxBodyBytes int64
}

// Defaults and limits of idempotency.
const (
	// DefaultIdempotencyHeader is the default of Idempotency.Header.
	DefaultIdempotencyHeader = "Idempotency-Key"
	// DefaultIdempotencyRetention is the default of Idempotency.Retention.
	DefaultIdempotencyRetention = 24 * time.Hour
	// DefaultIdempotencyMaxBody is the default of Idempotency.MaxBodyBytes.
	DefaultIdempotencyMaxBody = 64 << 10
	// MaxIdempotencyKeyLen is the longest idempotency key accepted, in
	// bytes (visible ASCII characters).
	MaxIdempotencyKeyLen = 255
	// MaxRecordedHeaderBytes bounds the response headers of a record, as
	// encoded (names, values and their lengths); a response whose headers
	// are larger is not recorded.
	MaxRecordedHeaderBytes = 8 << 10
	// ReplayedHeader is the response header of a replay, with the value
	// "true".
	ReplayedHeader = "Idempotent-Replayed"
)

// recordOverhead bounds what a record holds beside the response's headers
// and body: the fingerprint (64 hex digits), the encoding's version, the
// status and the header count.
const recordOverhead = 64 + 1 + binary.MaxVarintLen32 + binary.MaxVarintLen32

// WithIdempotency sets Config.Idempotency: the route records its responses
// by idempotency key and replays them to retries. Its Mode must be
// IdempotencyOptional or IdempotencyRequired.
func WithIdempotency(idem Idempotency) Option {
	return func(c *Config) {
		if idem.Mode != IdempotencyOptional && idem.Mode != IdempotencyRequired {
			c.optionError("WithIdempotency", idem.Mode, "the mode must be IdempotencyOptional or IdempotencyRequired")
			return
		}
		c.Idempotency = idem
	}
}

// withDefaults fills the zero fields of an Idempotency that is on.
func (i Idempotency) withDefaults() Idempotency {
	if i.Mode == IdempotencyOff {
		return i
	}
	if i.Header == "" {
		i.Header = DefaultIdempotencyHeader
	}
	if i.Retention == 0 {
		i.Retention = DefaultIdempotencyRetention
	}
	if i.MaxBodyBytes == 0 {
		i.MaxBodyBytes = DefaultIdempotencyMaxBody
	}
	return i
}

// problem returns what is wrong with i (defaults applied), or "".
func (i Idempotency) problem() string {
	switch {
	case i.Mode == IdempotencyOff:
		if i != (Idempotency{}) {
			return "idempotency options are set but its mode is off (set Mode to IdempotencyOptional or IdempotencyRequired)"
		}
	case i.Mode != IdempotencyOptional && i.Mode != IdempotencyRequired:
		return fmt.Sprintf("idempotency mode %v is not optional or required", i.Mode)
	case !validHeaderName(i.Header):
		return fmt.Sprintf("idempotency header %q is not a valid header name", i.Header)
	case i.Retention < 0:
		return fmt.Sprintf("idempotency retention %v is negative", i.Retention)
	case i.MaxBodyBytes < 0:
		return fmt.Sprintf("idempotency max body %d is negative", i.MaxBodyBytes)
	}
	return ""
}

// validHeaderName reports whether name is an HTTP field name (a token), as
// routetable checks idempotency-header.
func validHeaderName(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return name != ""
}

// idempotentRoute is a Guard's idempotency, checked and parsed.
type idempotentRoute struct {
	cfg    Idempotency
	header string            // canonical
	scope  *keyfunc.Template // nil without a scope
}

// errServeIdempotent is the error of an idempotent route served by Serve.
var errServeIdempotent = errors.New("reqlock/middleware: a route with idempotency served through Guard.Serve, " +
	"which cannot record responses; the adapter must call Guard.ServeResponse")

// newIdempotentRoute checks cfg's idempotency against the Locker's store and
// parses its scope. cfg has its defaults; its idempotency is on.
func newIdempotentRoute(locker *reqlock.Locker, cfg Config) (*idempotentRoute, error) {
	idem := cfg.Idempotency
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: route %q: idempotency: %s", ErrInvalidConfig, cfg.Name, fmt.Sprintf(format, args...))
	}
	if cfg.OnStoreError == FailOpen {
		return nil, bad("a fail-open route would run a retry again while the store is down; idempotency needs fail-closed")
	}
	if err := locker.CheckRecords(); err != nil {
		return nil, fmt.Errorf("%w: route %q: idempotency: %w", ErrInvalidConfig, cfg.Name, err)
	}
	largest := recordOverhead + MaxRecordedHeaderBytes + idem.MaxBodyBytes
	if err := locker.CheckRecord(int(min(largest, 1<<62)), idem.Retention); err != nil {
		return nil, fmt.Errorf("%w: route %q: idempotency: a record of max body %d bytes, %d bytes of headers and %d more "+
			"with retention %v: %w", ErrInvalidConfig, cfg.Name, idem.MaxBodyBytes, MaxRecordedHeaderBytes, recordOverhead,
			idem.Retention, err)
	}
	if err := locker.CheckKeyLen(len(reqlock.RecordKeyPrefix) + len(recordKey(cfg.Name, "", ""))); err != nil {
		return nil, fmt.Errorf("%w: route %q: idempotency: the record keys of the route (a hash and its name): %w (shorten the route's name)",
			ErrInvalidConfig, cfg.Name, err)
	}
	r := &idempotentRoute{cfg: idem, header: http.CanonicalHeaderKey(idem.Header)}
	if idem.Scope != "" {
		t, err := keyfunc.Parse(idem.Scope, keyfunc.WithMaxBodyBytes(cfg.MaxBodyBytes))
		if err != nil {
			return nil, fmt.Errorf("%w: route %q: idempotency: scope: %w", ErrInvalidConfig, cfg.Name, err)
		}
		if t.Multi() {
			return nil, bad("scope %q may yield several values; a scope is one value", idem.Scope)
		}
		r.scope = t
	}
	return r, nil
}

// requestKey returns the request's idempotency key, and whether it has one,
// or the rejection of a key that is missing on a required route or
// malformed: empty, longer than MaxIdempotencyKeyLen, with a character that
// is not visible ASCII, or given more than once.
func (ir *idempotentRoute) requestKey(r *http.Request) (string, bool, *Rejection) {
	vals := r.Header[ir.header]
	switch {
	case len(vals) == 0:
		if ir.cfg.Mode == IdempotencyRequired {
			return "", false, &Rejection{Status: http.StatusBadRequest, Reason: ReasonIdempotencyKeyMissing,
				Detail: fmt.Sprintf("the header %q is required on this route", ir.header)}
		}
		return "", false, nil
	case len(vals) > 1:
		return "", false, ir.malformed("is given more than once")
	}
	key := vals[0]
	if key == "" || len(key) > MaxIdempotencyKeyLen {
		return "", false, ir.malformed(fmt.Sprintf("must be 1 to %d characters", MaxIdempotencyKeyLen))
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] >= 0x7f {
			return "", false, ir.malformed("must be visible ASCII characters (no spaces)")
		}
	}
	return key, true, nil
}

func (ir *idempotentRoute) malformed(why string) *Rejection {
	return &Rejection{Status: http.StatusBadRequest, Reason: ReasonIdempotencyKeyInvalid,
		Detail: fmt.Sprintf("the header %q %s", ir.header, why)}
}

// recordKey is the record key of key in scope on the route name: a hash of
// scope and key, so that long or odd keys never reach the store raw, then
// the route's name. The hash comes first, in braces: a Redis Cluster hash
// tag (the first one in the key, whatever braces the name has), so that
// the records of a route spread over the slots and a store's sibling keys
// of a record key share its slot.
func recordKey(name, scope, key string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(binary.AppendUvarint(n[:0], uint64(len(scope))))
	io.WriteString(h, scope)
	io.WriteString(h, key)
	return "{" + hex.EncodeToString(h.Sum(nil)) + "}:" + name
}

// fingerprint identifies a request for its idempotency key: a SHA-256,
// hex-encoded, of the method, the escaped path, the raw query and the
// body, each length-prefixed. Headers are not part of it; a scope sets
// clients apart.
func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, part := range []string{"reqlock idempotency 1", r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		h.Write(binary.AppendUvarint(n[:0], uint64(len(part))))
		io.WriteString(h, part)
	}
	h.Write(binary.AppendUvarint(n[:0], uint64(len(body))))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// serveIdempotent is ServeResponse on a route with idempotency.
func (g *Guard) serveIdempotent(w http.ResponseWriter, req keyfunc.Request,
	next func(*http.Request, *Recording) error, reject func(*Rejection) error) error {
	r := req.HTTPRequest()
	ir := g.idem
	idemKey, ok, rej := ir.requestKey(r)
	switch {
	case rej != nil:
		return reject(rej)
	case !ok: // an optional route, without a key: locked as any route
		lock, rej := g.Enter(req)
		if rej != nil {
			g.rejected(r)
			return reject(rej)
		}
		defer g.Exit(r.Context(), lock)
		return next(g.WithLock(r, lock), nil)
	}
	// Everything that can refuse the request before it runs, first: no
	// claim for a request whose lock keys cannot be derived.
	key, keys, rej := g.requestKeys(req)
	if rej != nil {
		return reject(rej)
	}
	body, err := readRequestBody(r, g.cfg.MaxBodyBytes)
	switch {
	case errors.Is(err, keyfunc.ErrBodyTooLarge):
		return reject(g.keyRejection(err))
	case err != nil:
		return reject(&Rejection{Status: http.StatusBadRequest, Reason: ReasonBadKey,
			Detail: "the request body could not be read", Err: err})
	}
	var scope string
	if ir.scope != nil {
		if scope, err = ir.scope.Key(req); err != nil {
			return reject(g.keyRejection(err))
		}
	}
	fp := fingerprint(r, body)
	ctx := r.Context()
	claimCtx := reqlock.WithLabel(ctx, g.cfg.Name)
	claim, rec, err := g.locker.ClaimRecord(claimCtx, recordKey(g.cfg.Name, scope, idemKey), g.cfg.TTL, g.wait)
	switch {
	case err != nil:
		return reject(g.claimRejection(ctx, err))
	case rec != nil:
		return g.replay(w, rec, fp, reject)
	}
	if g.cfg.Watchdog {
		// The claim's TTL runs from now: keep it through the wait for the
		// route's lock too, or a duplicate could claim the key meanwhile;
		// and until the handler returns, even after the client left (its
		// retry is the duplicate): the claim is always finished or
		// released when the handler returns or panics, which stops it.
		claim.KeepAlive(context.WithoutCancel(ctx))
	}
	lock, rej := g.enterKeys(r, key, keys)
	if rej != nil || lock == nil {
		g.releaseClaim(ctx, claim)
		if rej == nil { // a fail-open run: refused at start-up, never here
			rej = g.internalRejection(errors.New("reqlock/middleware: an idempotent route ran unlocked"))
		}
		return reject(rej)
	}
	if claim.Lost() != nil || !time.Now().Before(claim.ValidUntil()) {
		// The claim ran out while the request waited for the route's lock
		// (a wait longer than the TTL, without the watchdog): a duplicate
		// may hold the key and run, so this request must not.
		g.Exit(ctx, lock)
		g.releaseClaim(ctx, claim)
		return reject(&Rejection{Status: http.StatusConflict, Reason: ReasonLockLost,
			Detail: "this request's claim of its idempotency key ran out while it waited for the lock; retry",
			Err:    fmt.Errorf("%w: the claim of the idempotency key ran out", reqlock.ErrLockLost)})
	}
	rc := newRecording(g, w.Header())
	rc.idem = newIdempotentRequest(rc, claim, fp)
	hctx := reqlock.NewContext(context.WithValue(ctx, recordingKey{}, rc), claim)
	if g.cfg.Watchdog {
		hctx = claim.KeepAlive(hctx)
	}
	done := false
	defer func() {
		if !done { // the handler panicked: nothing is recorded, and the panic goes on
			g.releaseClaim(ctx, claim)
			g.Exit(ctx, lock)
		}
	}()
	err = next(g.WithLock(r.WithContext(hctx), lock), rc)
	done = true
	g.finish(ctx, claim, lock, rc, fp)
	return err
}

// recordingKey is the request context key of a request's Recording, so that
// a rejection by a guard inside the route marks it.
type recordingKey struct{}

// rejected marks the response of the request r, when it is recorded, as a
// rejection by reqlock itself: never recorded.
func (g *Guard) rejected(r *http.Request) {
	if rc, _ := r.Context().Value(recordingKey{}).(*Recording); rc != nil {
		rc.mu.Lock()
		rc.rejected = true
		rc.mu.Unlock()
	}
}

// replay answers a request with rec, the record of its key, or 422 when the
// record answers another request.
func (g *Guard) replay(w http.ResponseWriter, rec *stores.Record, fp string, reject func(*Rejection) error) error {
	if rec.Fingerprint != fp {
		g.idemEvent(reqlock.IdempotencyMismatch)
		return reject(&Rejection{Status: http.StatusUnprocessableEntity, Reason: ReasonIdempotencyMismatch,
			Detail: "the idempotency key was used for a different request (method, path, query or body)"})
	}
	resp, err := decodeResponse(rec.Response)
	if err != nil {
		return reject(g.internalRejection(fmt.Errorf("reqlock/middleware: route %q: the record of an idempotency key: %w", g.cfg.Name, err)))
	}
	g.idemEvent(reqlock.IdempotencyReplayed)
	h := w.Header()
	for _, f := range resp.header {
		h[f.name] = f.values
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
	return nil
}

// claimRejection answers a request whose claim of its record key failed.
func (g *Guard) claimRejection(ctx context.Context, err error) *Rejection {
	if errors.Is(err, reqlock.ErrRecordInProgress) && !errors.Is(err, context.Canceled) {
		g.idemEvent(reqlock.IdempotencyConflict)
		return &Rejection{Status: http.StatusConflict, Reason: ReasonIdempotencyConflict, RetryAfter: g.cfg.RetryAfter,
			Detail: "a request with the same idempotency key is still being processed; retry later", Err: err}
	}
	if reqlock.OutcomeOf(ctx, err) == reqlock.OutcomeStoreError {
		// Fail-open routes are refused at start-up: an idempotent route
		// fails closed.
		g.logger.DebugContext(ctx, "reqlock: lock store failed claiming an idempotency key; answering 503",
			slog.String("route", g.cfg.Name), slog.Any("error", err))
		retry := g.cfg.RetryAfter
		var down *reqlock.StoreDownError
		if errors.As(err, &down) {
			retry = max(time.Until(down.NextProbe), time.Second)
		}
		return &Rejection{Status: http.StatusServiceUnavailable, Reason: ReasonStoreError, RetryAfter: retry,
			Detail: "the lock store is unavailable; retry later", Err: err}
	}
	return g.obtainRejection(ctx, "", err)
}

// releaseClaim releases a claim whose request records nothing.
func (g *Guard) releaseClaim(ctx context.Context, claim *reqlock.Lock) {
	if err := claim.Release(ctx); err != nil {
		g.logger.DebugContext(ctx, "reqlock: releasing an idempotency claim failed; the Locker retries it in the background",
			slog.String("route", g.cfg.Name), slog.Any("error", err))
	}
}

// finish ends a request whose handler returned: its claim becomes the
// record of the response rc recorded, or is released when the response is
// not to be recorded, at the same time as the route's lock is released.
func (g *Guard) finish(ctx context.Context, claim *reqlock.Lock, lock *reqlock.Lock, rc *Recording, fp string) {
	resp, why := rc.result()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		if why != "" {
			if why != whyStatus {
				g.logger.WarnContext(ctx, "reqlock: a response was not recorded for its idempotency key; a retry runs the handler again",
					slog.String("route", g.cfg.Name), slog.String("why", why))
			}
			g.releaseClaim(ctx, claim)
			return
		}
		if declared := rc.recorded(); declared != nil && !bytes.Equal(declared, resp) {
			g.logger.WarnContext(ctx, "reqlock: the handler recorded a response for its idempotency key that differs from the one it wrote; a replay gives the recorded one",
				slog.String("route", g.cfg.Name))
		}
		// When the handler recorded the response itself, FinishRecord of
		// the same token answers nil and leaves the handler's record.
		err := claim.FinishRecord(ctx, stores.Record{Fingerprint: fp, Response: resp}, g.idem.cfg.Retention)
		if err != nil && rc.recorded() != nil && errors.Is(err, reqlock.ErrNotHeld) {
			// The handler's own record replaced the claim, and the claim's
			// watchdog saw it as lost before FinishRecord: the record stands.
			g.logger.DebugContext(ctx, "reqlock: the claim of an idempotency key the handler recorded was no longer held",
				slog.String("route", g.cfg.Name), slog.Any("error", err))
			return
		}
		if err != nil {
			g.logger.WarnContext(ctx, "reqlock: recording a response for its idempotency key failed; a retry may run the handler again",
				slog.String("route", g.cfg.Name), slog.Any("error", err))
			return
		}
		g.idemEvent(reqlock.IdempotencyRecorded)
	}()
	g.Exit(ctx, lock)
	<-finished
}

// idemEvent reports an idempotency event to the Locker's metrics, when they
// take it.
func (g *Guard) idemEvent(e reqlock.IdempotencyEvent) {
	if m, ok := g.metrics.(reqlock.IdempotencyMetrics); ok {
		m.Idempotency(g.cfg.Name, e)
	}
}

// readRequestBody reads r's body, at most limit bytes, and puts it back for
// the handler. A longer body is an error wrapping keyfunc.ErrBodyTooLarge
// (the rest of it stays readable), and one that cannot be read an error
// wrapping keyfunc.ErrBadValue.
func readRequestBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if b, ok := r.Body.(bufferedBody); ok {
		body := b.bytes
		r.Body = bufferedBody{bytesReader(body), body}
		return body, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		r.Body = readCloser{io.MultiReader(bytesReader(body), r.Body), r.Body}
		return nil, fmt.Errorf("%w: reading the request body: %w", keyfunc.ErrBadValue, err)
	case int64(len(body)) > limit:
		r.Body = readCloser{io.MultiReader(bytesReader(body), r.Body), r.Body}
		return nil, fmt.Errorf("%w: over %d bytes", keyfunc.ErrBodyTooLarge, limit)
	}
	_ = r.Body.Close()
	r.Body = bufferedBody{bytesReader(body), body}
	return body, nil
}
