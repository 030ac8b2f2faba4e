package middleware

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/reqlock/reqlock"
	"github.com/reqlock/reqlock/keyfunc"
)

// Guard is one route's lock: its parsed key template and resolved
// configuration. Build it once at start-up with New or NewWithConfig; it is
// immutable and safe for concurrent use, and keeps no per-request state.
//
// Guard holds the request flow every adapter shares: Serve runs a request
// through it, Enter deriving the key and obtaining the lock, Exit releasing
// it, Reject answering a request that will not reach its handler. Handler is
// the net/http adapter; packages ginlock and echolock adapt Serve to gin and
// echo.
type Guard struct {
	locker    *reqlock.Locker
	templates []*keyfunc.Template // Key, then Keys
	multi     bool                // may yield several keys
	needsBody bool                // some template reads the body
	cfg       Config
	wait      time.Duration // cfg.Wait, with NoWait as 0
	logger    *slog.Logger
	metrics   reqlock.Metrics     // the Locker's, or nil
	modes     reqlock.ModeMetrics // the Locker's metrics, if they implement it; or nil
	mode      reqlock.HolderMode  // the route's mode
	failOpen  *failOpenWarning
	idem      *idempotentRoute // nil unless the route has idempotency
}

// failOpenWarning is when a Guard last warned that it ran a handler
// without the lock.
type failOpenWarning struct {
	mu    sync.Mutex
	epoch uint64    // storeEpoch of the last warning; 0: none yet
	at    time.Time // when it was logged
}

// failOpenRewarn is how often a Guard warns again of fail-open runs while
// the store's state stays the same.
const failOpenRewarn = time.Minute

// storeEpoch numbers the states of the Locker's store as its breaker saw
// them: 1 before the first outage, then one more at each change (down,
// back). It stays 1 with the breaker off.
func storeEpoch(h reqlock.StoreHealth) uint64 {
	e := 2*h.Outages + 1
	if h.Down {
		e--
	}
	return e
}

// warnFailOpen logs that the route runs its handlers without the lock: once
// per outage (see reqlock.Locker.StoreHealth), and again every minute while
// it lasts.
func (g *Guard) warnFailOpen(ctx context.Context, key string, err error) {
	epoch, now := storeEpoch(g.locker.StoreHealth()), time.Now()
	w := g.failOpen
	w.mu.Lock()
	// A warning in the state before an outage (its first failures, before
	// the breaker opened) covers the outage too.
	covered := epoch%2 == 0 && w.epoch == epoch-1
	warn := (w.epoch != epoch && !covered) || now.Sub(w.at) >= failOpenRewarn
	if warn {
		w.epoch, w.at = epoch, now
	}
	w.mu.Unlock()
	level := slog.LevelDebug
	if warn {
		level = slog.LevelWarn
	}
	g.logger.Log(ctx, level, "reqlock: lock store failed; running the handler WITHOUT the lock (route fails open; warned once per store outage)",
		slog.String("route", g.cfg.Name), slog.String("key", key), slog.Any("error", err))
}

// New builds a Guard for the key template key, starting from DefaultConfig
// and applying opts. It returns an error wrapping ErrInvalidConfig that names
// the problem when locker is nil, the template does not parse, an option
// is invalid, or the locker's store cannot honour the route's TTL or its
// longest key (see reqlock.Locker.CheckTTL and CheckKeyLen), or a shared or
// limited route's key (reqlock.Locker.CheckShared).
func New(locker *reqlock.Locker, key string, opts ...Option) (*Guard, error) {
	cfg := Config{Key: key}
	for _, opt := range opts {
		opt(&cfg)
	}
	return NewWithConfig(locker, cfg)
}

// NewWithConfig builds a Guard from cfg; zero fields take their values from
// DefaultConfig. Errors are those of New.
func NewWithConfig(locker *reqlock.Locker, cfg Config) (*Guard, error) {
	if locker == nil {
		return nil, fmt.Errorf("%w: route %q: locker is nil", ErrInvalidConfig, cfg.Key)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := locker.CheckTTL(cfg.TTL); err != nil {
		return nil, fmt.Errorf("%w: route %q: TTL: %w", ErrInvalidConfig, cfg.Name, err)
	}
	if cfg.HoldAtLeast > 0 {
		if err := locker.CheckTTL(cfg.HoldAtLeast); err != nil {
			return nil, fmt.Errorf("%w: route %q: HoldAtLeast: %w", ErrInvalidConfig, cfg.Name, err)
		}
	}
	g := &Guard{locker: locker, cfg: cfg, wait: max(cfg.Wait, 0), logger: cfg.Logger, metrics: locker.Metrics(),
		failOpen: new(failOpenWarning)}
	for _, raw := range cfg.templates() {
		tmpl, err := keyfunc.Parse(raw,
			keyfunc.WithMaxBodyBytes(cfg.MaxBodyBytes),
			keyfunc.WithMaxValueLen(cfg.MaxValueLen),
			keyfunc.WithMaxKeys(cfg.MaxKeys))
		if err != nil {
			return nil, fmt.Errorf("%w: route %q: %w", ErrInvalidConfig, cfg.Name, err)
		}
		if strings.HasPrefix(raw, reqlock.RecordKeyPrefix) {
			return nil, fmt.Errorf("%w: route %q: key template %q starts with %q, the prefix of idempotency record keys: "+
				"its locks would fall on the records of requests", ErrInvalidConfig, cfg.Name, raw, reqlock.RecordKeyPrefix)
		}
		if err := locker.CheckKeyLen(tmpl.MaxLen()); err != nil {
			return nil, fmt.Errorf("%w: route %q: key template %q renders keys of up to %d bytes (lower MaxValueLen to hash long values sooner): %w",
				ErrInvalidConfig, cfg.Name, raw, tmpl.MaxLen(), err)
		}
		g.templates = append(g.templates, tmpl)
		g.multi = g.multi || tmpl.Multi()
		g.needsBody = g.needsBody || tmpl.NeedsBody()
	}
	g.multi = g.multi || len(g.templates) > 1
	if cfg.Shared || cfg.Limit > 0 {
		if g.multi {
			return nil, fmt.Errorf("%w: route %q: key template %q may yield several keys, and a %s lock takes one",
				ErrInvalidConfig, cfg.Name, g.templates[0].String(), cfg.modeName())
		}
		if err := locker.CheckShared(); err != nil {
			return nil, fmt.Errorf("%w: route %q: a %s lock: %w", ErrInvalidConfig, cfg.Name, cfg.modeName(), err)
		}
	}
	if cfg.Idempotency.Mode != IdempotencyOff {
		idem, err := newIdempotentRoute(locker, cfg)
		if err != nil {
			return nil, err
		}
		g.idem = idem
	}
	g.mode = reqlock.HolderMode(cfg.modeName())
	g.modes, _ = g.metrics.(reqlock.ModeMetrics)
	if g.logger == nil {
		g.logger = locker.Logger()
	}
	return g, nil
}

// NewFromSpec builds a Guard from a one-line lock spec (see ParseSpec), the
// in-code form of a lock annotation:
//
//	g, err := middleware.NewFromSpec(locker, "@lock key=sku:<id> wait=2s on-timeout=409")
//
// Errors are those of ParseSpec and New.
func NewFromSpec(locker *reqlock.Locker, spec string) (*Guard, error) {
	cfg, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	return NewWithConfig(locker, cfg)
}

// Config returns the route's configuration with defaults applied.
func (g *Guard) Config() Config { return g.cfg }

// Skip reports whether the route lets r through without a lock, as Serve
// decides for a net/http request: SkipRequest with keyfunc.HTTPRequest(r).
// An adapter with its own view of the request calls SkipRequest with it,
// so that a native skipper (ginlock.WithSkipper) sees its framework's
// context.
func (g *Guard) Skip(r *http.Request) bool {
	return g.SkipRequest(keyfunc.HTTPRequest(r))
}

// SkipRequest reports whether the route's Skipper or RequestSkipper lets
// req through without a lock: Serve's decision.
func (g *Guard) SkipRequest(req keyfunc.Request) bool {
	return (g.cfg.Skipper != nil && g.cfg.Skipper(req.HTTPRequest())) ||
		(g.cfg.RequestSkipper != nil && g.cfg.RequestSkipper(req))
}

// Enter derives the request's key and obtains its lock, waiting up to the
// route's wait limit or the request's deadline, whichever is sooner.
//
// It returns the lock to hand to Exit once the handler is done, or a
// rejection to answer instead of running the handler. A nil lock with a nil
// rejection means the store failed on a FailOpen route: run the handler
// unlocked (the warning is already logged).
func (g *Guard) Enter(req keyfunc.Request) (*reqlock.Lock, *Rejection) {
	key, keys, rej := g.requestKeys(req)
	if rej != nil {
		return nil, rej
	}
	return g.enterKeys(req.HTTPRequest(), key, keys)
}

// requestKeys derives the request's key or keys (see keys), or the
// rejection of a request whose keys cannot be derived, counted as such.
func (g *Guard) requestKeys(req keyfunc.Request) (string, []string, *Rejection) {
	key, keys, err := g.keys(req)
	if err != nil {
		rej := g.keyRejection(err)
		if g.metrics != nil {
			g.metrics.Obtained(g.cfg.Name, reqlock.OutcomeBadKey, 0)
		}
		return "", nil, rej
	}
	return key, keys, nil
}

// enterKeys is Enter once the request's key (or keys, when not nil) are
// derived.
func (g *Guard) enterKeys(r *http.Request, key string, keys []string) (*reqlock.Lock, *Rejection) {
	var err error
	if g.wait > 0 && !g.needsBody {
		// net/http notices a client that leaves only once the body has been
		// read: buffer it so a waiter stops as soon as its client is gone.
		bufferBody(r, g.cfg.MaxBodyBytes)
	}
	ctx := r.Context()
	obtainCtx := ctx
	if g.metrics != nil {
		obtainCtx = reqlock.WithLabel(ctx, g.cfg.Name)
	}
	var lock *reqlock.Lock
	switch {
	case keys != nil:
		lock, err = g.locker.ObtainAll(obtainCtx, keys, g.cfg.TTL, g.wait)
	case g.cfg.Limit > 0:
		lock, err = g.locker.ObtainLimited(obtainCtx, key, g.cfg.Limit, g.cfg.TTL, g.wait)
	case g.cfg.Shared:
		lock, err = g.locker.ObtainShared(obtainCtx, key, g.cfg.TTL, g.wait)
	default:
		lock, err = g.locker.Obtain(obtainCtx, key, g.cfg.TTL, g.wait)
	}
	if err == nil {
		if g.cfg.HoldAtLeast > 0 {
			lock.HoldAtLeast(g.cfg.HoldAtLeast)
		}
		if g.modes != nil {
			g.modes.Holding(g.cfg.Name, g.mode, 1)
		}
		return lock, nil
	}
	if keys != nil {
		key = strings.Join(keys, " ")
	}
	return nil, g.obtainRejection(ctx, key, err)
}

// keys derives the request's key, or, on a route that may lock several,
// its keys (Locker.ObtainAll sorts and de-duplicates them). The route's
// MaxKeys caps the keys yielded, repeats included, as keyfunc caps each
// template's.
func (g *Guard) keys(req keyfunc.Request) (string, []string, error) {
	if !g.multi {
		key, err := g.templates[0].Key(req)
		if err == nil && strings.HasPrefix(key, reqlock.RecordKeyPrefix) {
			return "", nil, errRecordPrefix
		}
		return key, nil, err
	}
	var keys []string
	for _, t := range g.templates {
		ks, err := t.Keys(req)
		if err != nil {
			return "", nil, err
		}
		if keys == nil {
			keys = ks
		} else {
			keys = append(keys[:len(keys):len(keys)], ks...)
		}
	}
	for _, k := range keys {
		if strings.HasPrefix(k, reqlock.RecordKeyPrefix) {
			return "", nil, errRecordPrefix
		}
	}
	if len(keys) > g.cfg.MaxKeys {
		// Each template stops at MaxKeys; several together may not.
		return "", nil, fmt.Errorf("%w: the request yields %d keys", keyfunc.ErrTooManyKeys, len(keys))
	}
	return "", keys, nil
}

// errRecordPrefix is the error of a request whose values render a lock key
// that starts with reqlock.RecordKeyPrefix (a template that does is refused
// at start-up): such a lock would hold, or wait on, a record key.
var errRecordPrefix = fmt.Errorf("%w: the request's values render a lock key that starts with %q, the prefix of idempotency record keys",
	keyfunc.ErrBadValue, reqlock.RecordKeyPrefix)

// Exit releases lock after the handler returned or panicked. The release
// runs on a context the request's cancellation cannot end, bounded by the
// Locker's release timeout. A failed release is never panicked on; one that
// failed for a store reason is retried by the Locker in the background (see
// reqlock.WithPendingReleases) and logged at Debug only: the Locker logs the
// outage once, and its metrics count each release.
// A nil lock (fail-open run) or a lock the handler released itself is left
// alone.
func (g *Guard) Exit(ctx context.Context, lock *reqlock.Lock) {
	if lock != nil && g.modes != nil {
		g.modes.Holding(g.cfg.Name, g.mode, -1)
	}
	if lock == nil || lock.Released() {
		return
	}
	err := lock.Release(ctx)
	switch {
	case err == nil:
	case errors.Is(err, reqlock.ErrNotHeld) && lock.Lost() != nil:
		// The loss was logged when it was found, and the handler's
		// context ended then.
	case errors.Is(err, reqlock.ErrNotHeld):
		g.logger.WarnContext(ctx, "reqlock: lock was gone when the handler finished; raise the route's TTL or turn on the watchdog",
			slog.String("route", g.cfg.Name), slog.String("key", lock.Key()), slog.Duration("ttl", lock.TTL()), slog.Int64("fence", lock.Fence()))
	default:
		g.logger.DebugContext(ctx, "reqlock: release failed; the Locker retries it in the background",
			slog.String("route", g.cfg.Name), slog.String("key", lock.Key()), slog.Duration("ttl", lock.TTL()), slog.Any("error", err))
	}
}

// WithLock returns the request the handler gets: r with a context that
// carries lock (reqlock.NewContext: FromContext finds the lock there, the
// handler's own Obtain calls re-enter it and count under the route) and that
// ends when the lock can no longer be trusted, with a cause wrapping
// reqlock.ErrLockLost: its validity ran out, or a renewal found it gone. On a
// route with the watchdog it also starts the lock's watchdog (see
// Config.Watchdog). Exit's release stops the watchdog and ends the context.
// It returns r itself when lock is nil.
func (g *Guard) WithLock(r *http.Request, lock *reqlock.Lock) *http.Request {
	if lock == nil {
		return r
	}
	ctx := reqlock.NewContext(r.Context(), lock)
	if g.cfg.Watchdog {
		ctx = lock.KeepAlive(ctx)
	}
	return r.WithContext(ctx)
}

// Serve runs one request through the route's lock: the flow every adapter
// shares, so that an adapter only translates its router's context.
//
// A request the Skipper lets through goes to next unlocked. Otherwise Serve
// derives the key and obtains the lock (see Enter); a rejected request goes
// to reject instead of next, and Serve returns what reject returns. An
// admitted request goes to next as WithLock gives it, and the lock is
// released (see Exit) when next returns, also when it panics (the panic
// then continues). Serve returns what next returns.
//
// next runs the rest of the chain with the request it is given; reject
// answers the rejection, usually with Respond (Reject on net/http). Serve
// keeps neither.
//
// A route with idempotency (Config.Idempotency) records responses, which
// Serve cannot see: it answers every request of such a route 500 (reason
// internal), and its adapter calls ServeResponse instead.
func (g *Guard) Serve(req keyfunc.Request, next func(*http.Request) error, reject func(*Rejection) error) error {
	r := req.HTTPRequest()
	if g.SkipRequest(req) {
		return next(r)
	}
	if g.idem != nil {
		return reject(g.internalRejection(errServeIdempotent))
	}
	lock, rej := g.Enter(req)
	if rej != nil {
		g.rejected(r)
		return reject(rej)
	}
	defer g.Exit(r.Context(), lock)
	return next(g.WithLock(r, lock))
}

// ServeResponse is Serve for an adapter that lets the Guard see the
// response: every adapter of this module calls it, so that a route with
// idempotency (Config.Idempotency) can record and replay responses.
//
// w is the adapter's response writer, to which the Guard writes a replay
// itself (the recorded response, with the header Idempotent-Replayed:
// true) without calling next; rejections still go to reject. next runs the
// rest of the chain with the request it is given and, on a request whose
// response is recorded, a non-nil *Recording: the adapter then routes
// everything the handler writes through rec.Writer (see Recording), and
// next returns once the response is complete (echo: after the handler's
// error, if any, was rendered). On every other request rec is nil and next
// is Serve's. ServeResponse returns what next or reject returns, or nil
// after a replay.
func (g *Guard) ServeResponse(w http.ResponseWriter, req keyfunc.Request,
	next func(r *http.Request, rec *Recording) error, reject func(*Rejection) error) error {
	r := req.HTTPRequest()
	if g.SkipRequest(req) {
		return next(r, nil)
	}
	if g.idem != nil {
		return g.serveIdempotent(w, req, next, reject)
	}
	lock, rej := g.Enter(req)
	if rej != nil {
		g.rejected(r)
		return reject(rej)
	}
	defer g.Exit(r.Context(), lock)
	return next(g.WithLock(r, lock), nil)
}

// Reject writes rej with the route's Responder or RequestResponder
// (WriteProblem by default), for a request the net/http way. Adapters use
// Respond.
func (g *Guard) Reject(w http.ResponseWriter, r *http.Request, rej *Rejection) {
	_ = g.Respond(w, keyfunc.HTTPRequest(r), rej)
}

// Respond writes rej with the route's RequestResponder, Responder or, by
// default, WriteProblem; req is the adapter's view of the request. It
// returns the RequestResponder's error.
func (g *Guard) Respond(w http.ResponseWriter, req keyfunc.Request, rej *Rejection) error {
	return respond(&g.cfg, w, req, rej)
}

// respond writes rej with cfg's responder, or WriteProblem.
func respond(cfg *Config, w http.ResponseWriter, req keyfunc.Request, rej *Rejection) error {
	switch {
	case cfg.RequestResponder != nil:
		return cfg.RequestResponder(w, req, rej)
	case cfg.Responder != nil:
		cfg.Responder(w, req.HTTPRequest(), rej)
		return nil
	}
	WriteProblem(w, req.HTTPRequest(), rej)
	return nil
}

// HasResponder reports whether the route has its own Responder or
// RequestResponder.
func (g *Guard) HasResponder() bool {
	return g.cfg.Responder != nil || g.cfg.RequestResponder != nil
}

// keyRejection answers a request whose key could not be derived. Detail
// is keyfunc's words for the client (RequestDetail), never a value from the
// request; Err keeps keyfunc's message for logs. Where keyfunc has no words
// (several templates together over MaxKeys), Detail says what the route
// found.
func (g *Guard) keyRejection(err error) *Rejection {
	rej := &Rejection{Detail: keyfunc.RequestDetail(err), Err: err}
	switch {
	case errors.Is(err, keyfunc.ErrTooManyKeys):
		rej.Status, rej.Reason = http.StatusRequestEntityTooLarge, ReasonTooManyKeys
		if rej.Detail == "" {
			rej.Detail = fmt.Sprintf("the request names more than %d lock keys, the most this route locks at once", g.cfg.MaxKeys)
		}
	case errors.Is(err, keyfunc.ErrBodyTooLarge):
		rej.Status, rej.Reason = http.StatusRequestEntityTooLarge, ReasonBodyTooLarge
		if rej.Detail == "" {
			rej.Detail = fmt.Sprintf("the request body is over %d bytes", g.cfg.MaxBodyBytes)
		}
	case errors.Is(err, keyfunc.ErrMissing) || errors.Is(err, keyfunc.ErrBadValue):
		rej.Status, rej.Reason = http.StatusBadRequest, ReasonBadKey
		if rej.Detail == "" {
			rej.Detail = "the lock key could not be derived from the request"
		}
	default:
		return g.internalRejection(err)
	}
	return rej
}

func (g *Guard) obtainRejection(ctx context.Context, key string, err error) *Rejection {
	switch reqlock.OutcomeOf(ctx, err) {
	case reqlock.OutcomeCanceled:
		return &Rejection{Status: StatusClientClosedRequest, Reason: ReasonCanceled,
			Detail: "the request was cancelled while it waited for the lock", Err: err}
	case reqlock.OutcomeTimeout:
		if g.cfg.Limit > 0 {
			if g.modes != nil {
				g.modes.LimitReached(g.cfg.Name)
			}
			return &Rejection{Status: g.cfg.TimeoutStatus, Reason: ReasonLimit, RetryAfter: g.cfg.RetryAfter,
				Detail: "the limit of concurrent requests for the resource is reached; retry later", Err: err}
		}
		return &Rejection{Status: g.cfg.TimeoutStatus, Reason: ReasonTimeout, RetryAfter: g.cfg.RetryAfter,
			Detail: "the resource is locked by another request; retry later", Err: err}
	case reqlock.OutcomeStoreError:
		if g.cfg.OnStoreError == FailOpen {
			g.warnFailOpen(ctx, key, err)
			return nil
		}
		// Per request at Debug only: the Locker logs the outage once, and
		// metrics count each request.
		g.logger.DebugContext(ctx, "reqlock: lock store failed; answering 503",
			slog.String("route", g.cfg.Name), slog.String("key", key), slog.Any("error", err))
		retry := g.cfg.RetryAfter
		var down *reqlock.StoreDownError
		if errors.As(err, &down) {
			// The store is known down: retry when the next probe is due.
			retry = max(time.Until(down.NextProbe), time.Second)
		}
		return &Rejection{Status: http.StatusServiceUnavailable, Reason: ReasonStoreError, RetryAfter: retry,
			Detail: "the lock store is unavailable; retry later", Err: err}
	case reqlock.OutcomeLost:
		g.logger.WarnContext(ctx, "reqlock: the request's own lock on the key was lost; answering 409",
			slog.String("route", g.cfg.Name), slog.String("key", key), slog.Any("error", err))
		return &Rejection{Status: http.StatusConflict, Reason: ReasonLockLost,
			Detail: "this request's lock on the resource was lost; retry", Err: err}
	}
	return g.internalRejection(err)
}

func (g *Guard) internalRejection(err error) *Rejection {
	g.logger.Error("reqlock: unexpected error deriving or obtaining the lock", slog.String("route", g.cfg.Name), slog.Any("error", err))
	return &Rejection{Status: http.StatusInternalServerError, Reason: ReasonInternal,
		Detail: "the lock could not be obtained", Err: err}
}

// bufferBody reads an unread request body (up to limit bytes) into memory
// and puts it back, so the handler reads the same bytes. A larger body is
// put back as the buffered part followed by the rest of the stream.
func bufferBody(r *http.Request, limit int64) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 || r.ContentLength > limit {
		return
	}
	if _, done := r.Body.(bufferedBody); done {
		return
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	n, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil || n > limit:
		// Unread or partly read: hand the handler what we read plus the rest.
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf.Bytes()), r.Body), r.Body}
	default:
		r.Body = bufferedBody{bytes.NewReader(buf.Bytes()), buf.Bytes()}
	}
}

// bufferedBody is a request body held in memory: a reader of bytes.
type bufferedBody struct {
	*bytes.Reader
	bytes []byte
}

// bytesReader returns a reader of b.
func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func (bufferedBody) Close() error { return nil }

type readCloser struct {
	io.Reader
	io.Closer
}
