package routetable

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/reqlock/reqlock/keyfunc"
)

// MinWatchdogTTL is the least ttl a spec with watchdog accepts: the
// watchdog renews every third of the TTL, and 10ms is as often as is
// sensible. middleware.MinWatchdogTTL is this value.
const MinWatchdogTTL = 30 * time.Millisecond

// Spec is a parsed lock spec: the value of each field it sets. A field the
// spec leaves out is zero, and Has tells which fields it sets, so that
// whoever applies the spec (middleware.ParseSpec, middleware.NewRoutes) can
// merge it with defaults of its own.
type Spec struct {
	// Text is the spec as written.
	Text string
	// Keys are the key templates (key), in the order written; a parsed
	// Spec has at least one.
	Keys []string
	// TTL is the lease of each lock (ttl), at least 1ms.
	TTL time.Duration
	// Wait bounds the wait for a held key (wait). With Has("wait"), 0
	// means try once (wait=0 or wait=none).
	Wait time.Duration
	// TimeoutStatus is the status answered when the wait runs out
	// (on-timeout): 423, 409, 429 or 503.
	TimeoutStatus int
	// RetryAfter is the Retry-After delay (retry-after), above 0.
	RetryAfter time.Duration
	// FailOpen says the route runs unlocked when the store fails
	// (on-store-error=fail-open or run); on-store-error=503 or fail-closed
	// leaves it false.
	FailOpen bool
	// HoldAtLeast keeps the lock at least this long (hold-at-least).
	HoldAtLeast time.Duration
	// MaxKeys caps the keys of one request (max-keys), at least 1 and at
	// least the number of Keys.
	MaxKeys int
	// MaxBodyBytes bounds the body read for a key (max-body), at least 1.
	MaxBodyBytes int64
	// MaxValueLen is the escaped length above which a key value is hashed
	// (max-value-len), at least keyfunc.MinMaxValueLen.
	MaxValueLen int
	// Watchdog renews the lock while the handler runs (watchdog); the TTL,
	// if set, is then at least MinWatchdogTTL.
	Watchdog bool
	// Name labels the route in metrics and logs (name).
	Name string
	// Shared says the route's requests hold the key shared (mode=shared):
	// they run alongside each other and never with an exclusive holder.
	// mode=exclusive, the default, leaves it false.
	Shared bool
	// Limit lets at most this many requests hold the key at once (limit),
	// at least 1; 0 means no limit.
	Limit int
	// Idempotency is the route's idempotency mode (idempotency):
	// "required" or "optional"; "" when the spec has none.
	Idempotency string
	// IdempotencyHeader is the header of the idempotency key
	// (idempotency-header), a valid header name.
	IdempotencyHeader string
	// IdempotencyRetention is how long a response stays recorded
	// (idempotency-retention), above 0.
	IdempotencyRetention time.Duration
	// IdempotencyScope is the key template whose value sets clients' keys
	// apart (idempotency-scope); it yields one value.
	IdempotencyScope string
	// IdempotencyMaxBody is the largest response body recorded
	// (idempotency-max-body), at least 1.
	IdempotencyMaxBody int64

	set uint32 // bit i: specFields[i] is given
}

// Has reports whether the spec sets field, named as the grammar names it:
// "key", "ttl", "wait", "on-timeout", "retry-after", "on-store-error",
// "hold-at-least", "max-keys", "max-body", "max-value-len", "watchdog",
// "name", "mode", "limit", "idempotency", "idempotency-header",
// "idempotency-retention", "idempotency-scope" or "idempotency-max-body".
func (s Spec) Has(field string) bool {
	i := slices.Index(specFields, field)
	return i >= 0 && s.set&(1<<i) != 0
}

// ParseSpec parses a lock spec.
//
// Grammar:
//
//	spec   = [ "@lock" ] *( field )          ; fields separated by whitespace
//	field  = name "=" value / "watchdog"
//	value  = 1*( any byte but whitespace and '"' )
//	       / '"' 1*( any character but '"' and '\', or \" or \\ ) '"'
//
// Whitespace is space, tab, CR or LF. A spec that starts with another
// "@word" is an error. Fields come in any order, each at most once except
// key; only key is required. Each field, the Spec field it sets and its
// values (the defaults of the fields left out are middleware's, listed at
// middleware.ParseSpec):
//
//	field            Spec field     values
//	key              Keys           key template; repeat to lock several keys as one lock
//	ttl              TTL            duration, at least 1ms
//	wait             Wait           duration; 0 or none: try once
//	on-timeout       TimeoutStatus  423, 409, 429 or 503
//	retry-after      RetryAfter     duration, above 0
//	on-store-error   FailOpen       503 or fail-closed: false; fail-open or run: true
//	hold-at-least    HoldAtLeast    duration
//	max-keys         MaxKeys        whole number, at least 1 and at least the keys given
//	max-body         MaxBodyBytes   bytes: 65536, 64KiB, 1MiB; at least 1
//	max-value-len    MaxValueLen    whole number, at least 16
//	watchdog         Watchdog       true or false; bare watchdog is true
//	name             Name           label for metrics and logs
//	mode             Shared         exclusive: false; shared: true
//	limit            Limit          whole number, at least 1
//	idempotency      Idempotency    required or optional
//	idempotency-header     IdempotencyHeader     header name
//	idempotency-retention  IdempotencyRetention  duration, above 0
//	idempotency-scope      IdempotencyScope      key template that yields one value
//	idempotency-max-body   IdempotencyMaxBody    bytes: 65536, 64KiB, 1MiB; at least 1
//
// A duration is a Go duration such as 10s, 500ms or 1m30s, never negative.
// Key templates follow package keyfunc's grammar; they have no spaces but
// may be quoted. Each is parsed with the spec's max-body and max-value-len,
// so a bad template fails here, router syntax such as key=acct:{id} or
// key=acct::id included (the error shows <id>), as does a watchdog with a
// ttl below MinWatchdogTTL. A shared or limited spec locks one key: it
// takes one key template, which yields one key (no [*] JSON path); limit
// is a mode of its own and goes without mode. The idempotency-* fields
// need idempotency, which does not go with on-store-error=fail-open (see
// middleware.Idempotency). A template's escape \{ is written as is
// unquoted (key=\{stock}:<id>) and doubled in a quoted value
// (key="\\{stock}:<id>").
//
// An error is an *Error, wrapping ErrInvalid, that names the 1-based column
// (in characters) of the offending field, the field and the problem:
//
//	reqlock/routetable: invalid configuration: spec column 20: wait: "2x" is not a duration (such as 2s or 500ms)
func ParseSpec(spec string) (Spec, error) {
	s, err := parseSpec(spec)
	if err != nil {
		return Spec{}, err
	}
	return s, nil
}

// specKey is one key template of a spec and its column.
type specKey struct {
	template string
	col      int
}

// specParser holds the state of one parseSpec.
type specParser struct {
	text string
	spec Spec
	keys []specKey
	seen map[string]int // field name to column
}

// specFields lists the fields in the order error messages name them.
var specFields = []string{
	"key", "ttl", "wait", "on-timeout", "retry-after", "on-store-error",
	"hold-at-least", "max-keys", "max-body", "max-value-len", "watchdog", "name",
	"mode", "limit", "idempotency", "idempotency-header", "idempotency-retention", "idempotency-scope",
	"idempotency-max-body",
}

// parseSpec is ParseSpec with a concrete error type.
func parseSpec(text string) (Spec, *Error) {
	p := &specParser{text: text, spec: Spec{Text: text}, seen: map[string]int{}}
	if err := p.parse(); err != nil {
		return Spec{}, err
	}
	return p.spec, nil
}

// columnOf is the 1-based column, in characters, of text[off].
func (p *specParser) columnOf(off int) int { return utf8.RuneCountInString(p.text[:off]) + 1 }

func (p *specParser) errAt(off int, format string, args ...any) *Error {
	return errAtColumn(p.columnOf(off), nil, format, args...)
}

func errAtColumn(col int, cause error, format string, args ...any) *Error {
	return &Error{Where: fmt.Sprintf("spec column %d", col), Problem: fmt.Sprintf(format, args...), Err: cause}
}

func isSpecSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func (p *specParser) parse() *Error {
	s := p.text
	if !utf8.ValidString(s) {
		off := 0
		for off < len(s) {
			r, size := utf8.DecodeRuneInString(s[off:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			off += size
		}
		return p.errAt(off, "invalid UTF-8")
	}
	i := p.skipSpace(0)
	if i < len(s) && s[i] == '@' {
		end := i
		for end < len(s) && !isSpecSpace(s[end]) {
			end++
		}
		if s[i:end] != "@lock" {
			return p.errAt(i, "starts with %q, not \"@lock\"", s[i:end])
		}
		i = end
	}
	keysCol := make(map[string]int)
	for i = p.skipSpace(i); i < len(s); i = p.skipSpace(i) {
		start := i
		for i < len(s) && s[i] != '=' && !isSpecSpace(s[i]) {
			i++
		}
		name := s[start:i]
		switch {
		case name == "" && i < len(s) && s[i] == '=':
			return p.errAt(start, "\"=\" without a field name")
		case name == "@lock":
			return p.errAt(start, "\"@lock\" can only start the spec")
		case !slices.Contains(specFields, name):
			return p.errAt(start, "unknown field %q (known: %s)", name, strings.Join(specFields, ", "))
		}
		var value string
		if i == len(s) || s[i] != '=' {
			if name != "watchdog" {
				return p.errAt(start, "%s: no value (write %s=VALUE)", name, name)
			}
			value = "true"
		} else {
			var err *Error
			if value, i, err = p.value(start, name, i+1); err != nil {
				return err
			}
		}
		if first, ok := p.seen[name]; ok && name != "key" {
			return p.errAt(start, "%s given twice (first at column %d)", name, first)
		}
		col := p.columnOf(start)
		p.seen[name] = col
		p.spec.set |= 1 << slices.Index(specFields, name)
		if name == "key" {
			if first, ok := keysCol[value]; ok {
				return p.errAt(start, "key: %q given twice (first at column %d)", value, first)
			}
			keysCol[value] = col
			p.keys = append(p.keys, specKey{template: value, col: col})
			continue
		}
		if problem := p.set(name, value); problem != "" {
			return p.errAt(start, "%s: %s", name, problem)
		}
	}
	return p.finish()
}

func (p *specParser) skipSpace(i int) int {
	for i < len(p.text) && isSpecSpace(p.text[i]) {
		i++
	}
	return i
}

// value reads the value of the field name (at start) that begins at i, and
// returns it and the offset just after it.
func (p *specParser) value(start int, name string, i int) (string, int, *Error) {
	s := p.text
	if i == len(s) || isSpecSpace(s[i]) {
		return "", i, p.errAt(start, "%s: empty value", name)
	}
	var value string
	if s[i] == '"' {
		var b strings.Builder
		j := i + 1
		for {
			if j == len(s) {
				return "", j, p.errAt(start, "%s: unterminated quoted value", name)
			}
			c := s[j]
			if c == '"' {
				j++
				break
			}
			if c == '\\' {
				if j+1 == len(s) {
					return "", j, p.errAt(start, "%s: unterminated quoted value", name)
				}
				if s[j+1] != '"' && s[j+1] != '\\' {
					r, _ := utf8.DecodeRuneInString(s[j+1:])
					return "", j, p.errAt(start, "%s: backslash before %q in quoted value (only \\\" and \\\\ are escapes)", name, r)
				}
				c = s[j+1]
				j++
			}
			b.WriteByte(c)
			j++
		}
		i = j
		if i < len(s) && !isSpecSpace(s[i]) {
			return "", i, p.errAt(start, "%s: no space after the closing quote", name)
		}
		value = b.String()
		if value == "" {
			return "", i, p.errAt(start, "%s: empty value", name)
		}
	} else {
		end := i
		for end < len(s) && !isSpecSpace(s[end]) {
			end++
		}
		value, i = s[i:end], end
		if strings.IndexByte(value, '"') >= 0 {
			return "", i, p.errAt(start, "%s: stray '\"' in an unquoted value (quote the whole value)", name)
		}
	}
	for _, r := range value {
		if r < ' ' || r == 0x7f {
			return "", i, p.errAt(start, "%s: control character %U in value", name, r)
		}
	}
	return value, i, nil
}

// set applies the field name (not key) and returns the problem with value,
// if any.
func (p *specParser) set(name, value string) string {
	s := &p.spec
	switch name {
	case "ttl":
		d, problem := specDuration(value)
		switch {
		case problem != "":
			return problem
		case d < time.Millisecond:
			return fmt.Sprintf("%q is below 1ms", value)
		}
		s.TTL = d
	case "wait":
		if value == "none" {
			return ""
		}
		d, problem := specDuration(value)
		if problem != "" {
			if d < 0 {
				problem += " (write wait=none to try once)"
			}
			return problem
		}
		s.Wait = d
	case "on-timeout":
		switch value {
		case "423", "409", "429", "503":
			s.TimeoutStatus, _ = strconv.Atoi(value)
		default:
			return fmt.Sprintf("%q is not one of 423, 409, 429, 503", value)
		}
	case "retry-after":
		d, problem := specDuration(value)
		switch {
		case problem != "":
			return problem
		case d == 0:
			return fmt.Sprintf("%q is zero (Retry-After is whole seconds, at least 1)", value)
		}
		s.RetryAfter = d
	case "on-store-error":
		switch value {
		case "503", "fail-closed":
			s.FailOpen = false
		case "fail-open", "run":
			s.FailOpen = true
		default:
			return fmt.Sprintf("%q is not one of 503, fail-closed, fail-open, run", value)
		}
	case "hold-at-least":
		d, problem := specDuration(value)
		if problem != "" {
			return problem
		}
		s.HoldAtLeast = d
	case "max-keys":
		n, problem := specInt(value, 1)
		if problem != "" {
			return problem
		}
		s.MaxKeys = n
	case "max-body":
		n, problem := specSize(value)
		if problem != "" {
			return problem
		}
		s.MaxBodyBytes = n
	case "max-value-len":
		n, problem := specInt(value, keyfunc.MinMaxValueLen)
		if problem != "" {
			return problem
		}
		s.MaxValueLen = n
	case "watchdog":
		switch value {
		case "true":
			s.Watchdog = true
		case "false":
			s.Watchdog = false
		default:
			return fmt.Sprintf("%q is not true or false", value)
		}
	case "name":
		s.Name = value
	case "mode":
		switch value {
		case "exclusive":
			s.Shared = false
		case "shared":
			s.Shared = true
		default:
			return fmt.Sprintf("%q is not exclusive or shared", value)
		}
	case "limit":
		n, problem := specInt(value, 1)
		if problem != "" {
			return problem
		}
		s.Limit = n
	case "idempotency":
		switch value {
		case "required", "optional":
			s.Idempotency = value
		default:
			return fmt.Sprintf("%q is not required or optional", value)
		}
	case "idempotency-header":
		if !validHeaderName(value) {
			return fmt.Sprintf("%q is not a header name", value)
		}
		s.IdempotencyHeader = value
	case "idempotency-retention":
		d, problem := specDuration(value)
		switch {
		case problem != "":
			return problem
		case d == 0:
			return fmt.Sprintf("%q is zero", value)
		}
		s.IdempotencyRetention = d
	case "idempotency-scope":
		s.IdempotencyScope = value // a template: checked with the keys
	case "idempotency-max-body":
		n, problem := specSize(value)
		if problem != "" {
			return problem
		}
		s.IdempotencyMaxBody = n
	}
	return ""
}

// validHeaderName reports whether name is an HTTP field name (a token).
func validHeaderName(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return name != ""
}

// specDuration parses a non-negative duration.
func specDuration(value string) (time.Duration, string) {
	d, err := time.ParseDuration(value)
	switch {
	case err != nil:
		return 0, fmt.Sprintf("%q is not a duration (such as 2s or 500ms)", value)
	case d < 0:
		return d, fmt.Sprintf("%q is negative", value)
	}
	return d, ""
}

// specInt parses a whole number of at least least.
func specInt(value string, least int) (int, string) {
	for i := 0; i < len(value); i++ {
		if value[i] < '0' || value[i] > '9' {
			return 0, fmt.Sprintf("%q is not a whole number", value)
		}
	}
	n, err := strconv.Atoi(value)
	switch {
	case err != nil:
		return 0, fmt.Sprintf("%q is too large", value)
	case n < least:
		return 0, fmt.Sprintf("%q is below %d", value, least)
	}
	return n, ""
}

// specSize parses a size in bytes: digits, optionally followed by KiB or MiB.
func specSize(value string) (int64, string) {
	digits, shift := value, 0
	if s, ok := strings.CutSuffix(value, "KiB"); ok {
		digits, shift = s, 10
	} else if s, ok := strings.CutSuffix(value, "MiB"); ok {
		digits, shift = s, 20
	}
	if digits == "" || strings.TrimLeft(digits, "0123456789") != "" {
		return 0, fmt.Sprintf("%q is not a size in bytes (such as 65536, 64KiB or 1MiB)", value)
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n > (1<<63-1)>>shift {
		return 0, fmt.Sprintf("%q is too large", value)
	}
	if n == 0 {
		return 0, fmt.Sprintf("%q is below 1 byte", value)
	}
	return n << shift, ""
}

// finish checks what needs the whole spec: the keys, their templates and
// their number, and the watchdog's ttl.
func (p *specParser) finish() *Error {
	if len(p.keys) == 0 {
		return p.errAt(0, "no key (such as key=sku:<id>)")
	}
	var opts []keyfunc.Option
	if p.spec.MaxBodyBytes != 0 {
		opts = append(opts, keyfunc.WithMaxBodyBytes(p.spec.MaxBodyBytes))
	}
	if p.spec.MaxValueLen != 0 {
		opts = append(opts, keyfunc.WithMaxValueLen(p.spec.MaxValueLen))
	}
	if p.spec.Has("limit") && p.spec.Has("mode") {
		return errAtColumn(p.seen["mode"], nil, "mode: a limit is a mode of its own (at most %d holders at once, never with an exclusive one); leave mode out",
			p.spec.Limit)
	}
	oneKey := "" // the field that makes the spec lock one key
	switch {
	case p.spec.Limit > 0:
		oneKey = "limit"
	case p.spec.Shared:
		oneKey = "mode"
	}
	if oneKey != "" && len(p.keys) > 1 {
		return errAtColumn(p.seen[oneKey], nil, "%s: a shared or limited lock takes one key; this spec has %d key templates", oneKey, len(p.keys))
	}
	for _, k := range p.keys {
		t, err := keyfunc.Parse(k.template, opts...)
		if err != nil {
			return errAtColumn(k.col, err, "key: %v", err)
		}
		if oneKey != "" && t.Multi() {
			return errAtColumn(k.col, nil, "key: %q may yield several keys, and a shared or limited lock takes one", k.template)
		}
		p.spec.Keys = append(p.spec.Keys, k.template)
	}
	if p.spec.MaxKeys != 0 && p.spec.MaxKeys < len(p.keys) {
		return errAtColumn(p.seen["max-keys"], nil, "max-keys: %d is below the %d key templates, each of which yields at least one key",
			p.spec.MaxKeys, len(p.keys))
	}
	if p.spec.Idempotency == "" {
		for _, f := range []string{"idempotency-header", "idempotency-retention", "idempotency-scope", "idempotency-max-body"} {
			if p.spec.Has(f) {
				return errAtColumn(p.seen[f], nil, "%s: needs idempotency=required or idempotency=optional", f)
			}
		}
	} else if p.spec.FailOpen {
		return errAtColumn(p.seen["idempotency"], nil, "idempotency: does not go with on-store-error=fail-open, "+
			"which would run a retry again while the store is down")
	}
	if p.spec.IdempotencyScope != "" {
		t, err := keyfunc.Parse(p.spec.IdempotencyScope, opts...)
		if err != nil {
			return errAtColumn(p.seen["idempotency-scope"], err, "idempotency-scope: %v", err)
		}
		if t.Multi() {
			return errAtColumn(p.seen["idempotency-scope"], nil, "idempotency-scope: %q may yield several values; a scope is one value",
				p.spec.IdempotencyScope)
		}
	}
	if p.spec.Watchdog && p.spec.TTL != 0 && p.spec.TTL < MinWatchdogTTL {
		return errAtColumn(p.seen["watchdog"], nil, "watchdog: needs a ttl of at least %v, not %v", MinWatchdogTTL, p.spec.TTL)
	}
	return nil
}
