// Package middleware holds the framework-neutral request flow of a locked
// route (Guard) and its net/http adapter.
//
// # Lock annotation specs
//
// A route's Config can also be written as a one-line spec, for route tables
// and annotations:
//
//	@lock key=sku:<id> wait=2s ttl=10s on-timeout=423 on-store-error=503
//
// The grammar:
//
//	spec   = [ "@lock" ] *( field )          ; fields separated by whitespace
//	field  = name "=" value / "watchdog"
//	value  = 1*( any byte but whitespace and '"' )
//	       / '"' 1*( any character but '"' and '\', or \" or \\ ) '"'
//
// Each field sets one Config field (key: Key, then Keys; ttl: TTL; wait:
// Wait; on-timeout: TimeoutStatus; retry-after: RetryAfter; on-store-error:
// OnStoreError; hold-at-least: HoldAtLeast; max-keys: MaxKeys; max-body:
// MaxBodyBytes; max-value-len: MaxValueLen; watchdog: Watchdog; name: Name)
// and only key is required. ParseSpec parses a spec and lists every field's
// values and default. Errors give the column of the offending field:
//
//	reqlock/middleware: invalid configuration: spec column 20: wait: "2x" is not a duration (such as 2s or 500ms)
//
// ParseRoute, ParseRouteTable and LoadRouteTable read tables that map routes
// such as "POST /skus/{id}/deduct" to specs, from code or from a JSON or YAML
// file, and report every problem of a file at once, with its line.
package middleware

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/reqlock/reqlock/keyfunc"
)

// minSpecMaxValueLen is the least max-value-len keyfunc accepts
// (keyfunc.WithMaxValueLen); a test keeps the two in step.
const minSpecMaxValueLen = 16

// ParseSpec parses a lock annotation spec into a Config. Fields the spec
// leaves out stay zero, so DefaultConfig supplies them when the Config is
// used (NewWithConfig).
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
// key. Each field, the Config field it sets, its values and its default:
//
//	field            Config field   values                                  default
//	key              Key, Keys      key template; repeat to lock several    required
//	                                keys as one lock (the first is Key)
//	ttl              TTL            duration, at least 1ms                  10s
//	wait             Wait           duration; 0 or none: NoWait (try once)  2s
//	on-timeout       TimeoutStatus  423, 409, 429 or 503                    423
//	retry-after      RetryAfter     duration, above 0                       1s
//	on-store-error   OnStoreError   503 or fail-closed: FailClosed;         fail-closed
//	                                fail-open or run: FailOpen
//	hold-at-least    HoldAtLeast    duration                                0 (release at once)
//	max-keys         MaxKeys        whole number, at least 1                64
//	max-body         MaxBodyBytes   bytes: 65536, 64KiB, 1MiB; at least 1   1MiB
//	max-value-len    MaxValueLen    whole number, at least 16               64
//	watchdog         Watchdog       true or false; bare watchdog is true    false
//	name             Name           label for metrics and logs              the key templates
//
// A duration is a Go duration such as 10s, 500ms or 1m30s, never negative.
// Key templates follow package keyfunc's grammar; they have no spaces but
// may be quoted. Each is parsed with the spec's max-body and max-value-len,
// so a bad template fails here, router syntax such as key=acct:{id} or
// key=acct::id included (the error shows <id>), as does a watchdog with a
// ttl below MinWatchdogTTL. A template's escape \{ is written as is
// unquoted (key=\{stock}:<id>) and doubled in a quoted value
// (key="\\{stock}:<id>").
//
// Every error wraps ErrInvalidConfig and names the 1-based column (in
// characters) of the offending field, the field and the problem:
//
//	reqlock/middleware: invalid configuration: spec column 20: wait: "2x" is not a duration (such as 2s or 500ms)
func ParseSpec(spec string) (Config, error) {
	cfg, err := parseSpec(spec)
	if err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// MustParseSpec is like ParseSpec but panics when ParseSpec returns an
// error. Use it at start-up only.
func MustParseSpec(spec string) Config {
	cfg, err := ParseSpec(spec)
	if err != nil {
		panic(err)
	}
	return cfg
}

// configError is a configuration problem located at where: "spec column 7"
// or "routes.yaml:4". It wraps ErrInvalidConfig and cause, if any.
type configError struct {
	where string
	msg   string
	cause error
}

func (e *configError) Error() string {
	if e.where == "" {
		return ErrInvalidConfig.Error() + ": " + e.msg
	}
	return ErrInvalidConfig.Error() + ": " + e.where + ": " + e.msg
}

func (e *configError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrInvalidConfig}
	}
	return []error{ErrInvalidConfig, e.cause}
}

// detail is the message without the ErrInvalidConfig prefix.
func (e *configError) detail() string {
	if e.where == "" {
		return e.msg
	}
	return e.where + ": " + e.msg
}

// specKey is one key template of a spec and its column.
type specKey struct {
	template string
	col      int
}

// specParser holds the state of one parseSpec.
type specParser struct {
	spec string
	cfg  Config
	keys []specKey
	seen map[string]int // field name to column
}

// specFields lists the fields in the order error messages name them.
var specFields = []string{
	"key", "ttl", "wait", "on-timeout", "retry-after", "on-store-error",
	"hold-at-least", "max-keys", "max-body", "max-value-len", "watchdog", "name",
}

// parseSpec is ParseSpec with a concrete error type.
func parseSpec(spec string) (Config, *configError) {
	p := &specParser{spec: spec, seen: map[string]int{}}
	if err := p.parse(); err != nil {
		return Config{}, err
	}
	return p.cfg, nil
}

func (p *specParser) errAt(off int, format string, args ...any) *configError {
	col := utf8.RuneCountInString(p.spec[:off]) + 1
	return &configError{where: fmt.Sprintf("spec column %d", col), msg: fmt.Sprintf(format, args...)}
}

func isSpecSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

func (p *specParser) parse() *configError {
	s := p.spec
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
		case !knownSpecField(name):
			return p.errAt(start, "unknown field %q (known: %s)", name, strings.Join(specFields, ", "))
		}
		var value string
		if i == len(s) || s[i] != '=' {
			if name != "watchdog" {
				return p.errAt(start, "%s: no value (write %s=VALUE)", name, name)
			}
			value = "true"
		} else {
			var err *configError
			if value, i, err = p.value(start, name, i+1); err != nil {
				return err
			}
		}
		if first, ok := p.seen[name]; ok && name != "key" {
			return p.errAt(start, "%s given twice (first at column %d)", name, first)
		}
		col := utf8.RuneCountInString(s[:start]) + 1
		p.seen[name] = col
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
	for i < len(p.spec) && isSpecSpace(p.spec[i]) {
		i++
	}
	return i
}

// value reads the value of the field name (at start) that begins at i, and
// returns it and the offset just after it.
func (p *specParser) value(start int, name string, i int) (string, int, *configError) {
	s := p.spec
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

func knownSpecField(name string) bool {
	for _, f := range specFields {
		if f == name {
			return true
		}
	}
	return false
}

// set applies the field name (not key) and returns the problem with value,
// if any.
func (p *specParser) set(name, value string) string {
	c := &p.cfg
	switch name {
	case "ttl":
		d, problem := specDuration(value)
		switch {
		case problem != "":
			return problem
		case d < time.Millisecond:
			return fmt.Sprintf("%q is below 1ms", value)
		}
		c.TTL = d
	case "wait":
		if value == "none" {
			c.Wait = NoWait
			return ""
		}
		d, problem := specDuration(value)
		if problem != "" {
			if d < 0 {
				problem += " (write wait=none to try once)"
			}
			return problem
		}
		if d == 0 {
			d = NoWait
		}
		c.Wait = d
	case "on-timeout":
		switch value {
		case "423", "409", "429", "503":
			c.TimeoutStatus, _ = strconv.Atoi(value)
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
		c.RetryAfter = d
	case "on-store-error":
		switch value {
		case "503", "fail-closed":
			c.OnStoreError = FailClosed
		case "fail-open", "run":
			c.OnStoreError = FailOpen
		default:
			return fmt.Sprintf("%q is not one of 503, fail-closed, fail-open, run", value)
		}
	case "hold-at-least":
		d, problem := specDuration(value)
		if problem != "" {
			return problem
		}
		c.HoldAtLeast = d
	case "max-keys":
		n, problem := specInt(value, 1)
		if problem != "" {
			return problem
		}
		c.MaxKeys = n
	case "max-body":
		n, problem := specSize(value)
		if problem != "" {
			return problem
		}
		c.MaxBodyBytes = n
	case "max-value-len":
		n, problem := specInt(value, minSpecMaxValueLen)
		if problem != "" {
			return problem
		}
		c.MaxValueLen = n
	case "watchdog":
		switch value {
		case "true":
			c.Watchdog = true
		case "false":
			c.Watchdog = false
		default:
			return fmt.Sprintf("%q is not true or false", value)
		}
	case "name":
		c.Name = value
	}
	return ""
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

// finish checks what needs the whole spec: the keys and their templates,
// and the Config's own validation.
func (p *specParser) finish() *configError {
	if len(p.keys) == 0 {
		return p.errAt(0, "no key (such as key=sku:<id>)")
	}
	p.cfg.Key = p.keys[0].template
	for _, k := range p.keys[1:] {
		p.cfg.Keys = append(p.cfg.Keys, k.template)
	}
	d := p.cfg.withDefaults()
	for _, k := range p.keys {
		_, err := keyfunc.Parse(k.template,
			keyfunc.WithMaxBodyBytes(d.MaxBodyBytes), keyfunc.WithMaxValueLen(d.MaxValueLen))
		if err != nil {
			return &configError{where: fmt.Sprintf("spec column %d", k.col), msg: "key: " + err.Error(), cause: err}
		}
	}
	if d.Watchdog && d.TTL < MinWatchdogTTL {
		return &configError{
			where: fmt.Sprintf("spec column %d", p.seen["watchdog"]),
			msg:   fmt.Sprintf("watchdog: needs a ttl of at least %v, not %v", MinWatchdogTTL, d.TTL),
		}
	}
	if err := d.validate(); err != nil {
		// Unreachable while the field checks above cover validate's.
		return &configError{where: "spec column 1", msg: strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": ")}
	}
	return nil
}
