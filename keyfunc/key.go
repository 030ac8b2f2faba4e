package keyfunc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
)

// hashedLen is the length of a hashed value: "#" and 32 hex digits.
const hashedLen = 1 + 2*16

// Key renders the key of r. It returns an error wrapping ErrMissing when a
// value is absent or empty, ErrBadValue when a value or the body is unusable,
// and ErrBodyTooLarge when the body needed for json or form placeholders is
// longer than MaxBodyBytes; messages name the placeholder, never the value.
// On a Template not made by Parse, or one that is Multi, it returns an error
// wrapping ErrSyntax.
//
// Key reads the body at most once and then restores r.HTTPRequest().Body
// (and GetBody) in place, so the handler can read the same bytes again; after
// ErrBodyTooLarge, Body replays what was read followed by the rest of the
// stream. Key is safe to call concurrently for different requests, not for
// one request.
func (t *Template) Key(r Request) (string, error) {
	if t == nil || len(t.parts) == 0 {
		return "", fmt.Errorf("%w: template not parsed (use Parse)", ErrSyntax)
	}
	if t.multi {
		return "", fmt.Errorf("%w: %q: a template with [*] yields several keys (use Keys)", ErrSyntax, t.raw)
	}
	if t.holes == 0 {
		return t.parts[0].literal, nil
	}
	st := keyState{req: r, maxBody: t.maxBodyBytes}
	var small [8]string
	vals := small[:0]
	n := t.literalLen
	for _, p := range t.parts {
		if p.ph == nil {
			continue
		}
		v, err := st.value(p.ph)
		if err != nil {
			return "", err
		}
		vals = append(vals, v)
		n += renderedLen(v, t.maxValueLen)
	}
	return t.render(vals, n), nil
}

// render writes the template with vals, one per placeholder in order, each
// escaped or hashed; n is the rendered length.
func (t *Template) render(vals []string, n int) string {
	var b strings.Builder
	b.Grow(n)
	i := 0
	for _, p := range t.parts {
		if p.ph == nil {
			b.WriteString(p.literal)
			continue
		}
		writeValue(&b, vals[i], t.maxValueLen)
		i++
	}
	return b.String()
}

// Keys renders every key of r. A Multi template yields one key per element
// of the array at its [*], in the array's order, duplicates included; any
// other template yields the one key of Key. An element's value is escaped or
// hashed like any value: each key is what Key would render if the [*]
// placeholder read that element alone.
//
// Keys fails, rendering no key, as Key does, and also: with ErrMissing when
// the array is absent or empty or an element lacks the value, with
// ErrBadValue when the value at [*] is not an array or an element's value is
// unusable, and with ErrTooManyKeys when the array has more elements than
// MaxKeys. Messages name the placeholder, and the element's index, never a
// value. Keys reads and restores the body as Key does.
func (t *Template) Keys(r Request) ([]string, error) {
	if !t.Multi() {
		k, err := t.Key(r)
		if err != nil {
			return nil, err
		}
		return []string{k}, nil
	}
	st := keyState{req: r, maxBody: t.maxBodyBytes}
	// fixed holds every key's parts before [*], then those after it.
	var fixed strings.Builder
	split := 0
	var elems []string
	for _, p := range t.parts {
		switch {
		case p.ph == nil:
			fixed.WriteString(p.literal)
		case p.ph.multi:
			var err error
			if elems, err = st.values(p.ph, t.maxKeys); err != nil {
				return nil, err
			}
			split = fixed.Len()
		default:
			v, err := st.value(p.ph)
			if err != nil {
				return nil, err
			}
			writeValue(&fixed, v, t.maxValueLen)
		}
	}
	around := fixed.String()
	prefix, suffix := around[:split], around[split:]
	total := len(elems) * len(around)
	for _, e := range elems {
		total += renderedLen(e, t.maxValueLen)
	}
	// One string holds all the keys; each key is a slice of it.
	var b strings.Builder
	b.Grow(total)
	for _, e := range elems {
		b.WriteString(prefix)
		writeValue(&b, e, t.maxValueLen)
		b.WriteString(suffix)
	}
	all := b.String()
	keys := make([]string, len(elems))
	for i, e := range elems {
		n := len(around) + renderedLen(e, t.maxValueLen)
		keys[i], all = all[:n], all[n:]
	}
	return keys, nil
}

// keyState caches what one Key call parsed from the request.
type keyState struct {
	req     Request
	maxBody int64

	hr       *http.Request
	hrLoaded bool

	query       url.Values
	queryParsed bool

	body *bodyState
}

func (st *keyState) http() *http.Request {
	if !st.hrLoaded {
		st.hrLoaded = true
		if st.req != nil {
			st.hr = st.req.HTTPRequest()
		}
	}
	return st.hr
}

// queryValues returns the parsed URL query, parsing it at most once.
func (st *keyState) queryValues() url.Values {
	if !st.queryParsed {
		st.queryParsed = true
		if hr := st.http(); hr != nil && hr.URL != nil {
			st.query = hr.URL.Query()
		}
	}
	return st.query
}

// value returns the raw, non-empty value of ph.
func (st *keyState) value(ph *placeholder) (string, error) {
	var v string
	switch ph.src {
	case srcPath:
		if st.req != nil {
			v = st.req.PathValue(ph.name)
		}
	case srcQuery:
		v = st.queryValues().Get(ph.name)
	case srcHeader:
		if hr := st.http(); hr != nil {
			v = hr.Header.Get(ph.name)
		}
	case srcJSON, srcForm:
		if st.body == nil {
			st.body = &bodyState{}
		}
		var err error
		if v, err = st.body.value(st.http(), st.maxBody, ph); err != nil {
			return "", err
		}
		// r.FormValue reads the query before a multipart body: a field in
		// both with different values could lock one thing and change another.
		if ph.src == srcForm && v != "" {
			if q := st.queryValues()[ph.name]; len(q) > 0 && q[0] != v {
				return "", badValue(ph, "the field is also in the URL query, with another value",
					ph.where()+" is also in the URL query, with another value")
			}
		}
	case srcCtx:
		if st.req != nil {
			var err error
			if v, err = ctxValue(st.req, ph); err != nil {
				return "", err
			}
		}
	}
	if v == "" {
		return "", missing(ph)
	}
	return v, nil
}

// values returns the raw, non-empty values of ph, a json placeholder with
// [*]: one per array element, at most maxKeys.
func (st *keyState) values(ph *placeholder, maxKeys int) ([]string, error) {
	if st.body == nil {
		st.body = &bodyState{}
	}
	vs, err := st.body.values(st.http(), st.maxBody, ph, maxKeys)
	if err != nil {
		return nil, err
	}
	if len(vs) == 0 {
		return nil, missing(ph) // no body, or no array
	}
	return vs, nil
}

// missing is the error of a placeholder whose value is absent or empty.
func missing(ph *placeholder) error {
	return &requestError{msg: ErrMissing.Error() + ": " + ph.text, detail: ph.missingDetail(), errs: []error{ErrMissing}}
}

// missingWhy is missing with a reason, such as the element that lacks the
// value, and the client's form of it (see RequestDetail).
func missingWhy(ph *placeholder, why, detail string) error {
	return &requestError{msg: ErrMissing.Error() + ": " + ph.text + ": " + why, detail: detail, errs: []error{ErrMissing}}
}

// badValue is the error of a placeholder whose value, or the body it is
// read from, cannot be part of a key: why says so for logs, detail for the
// client (see RequestDetail).
func badValue(ph *placeholder, why, detail string) error {
	return &requestError{msg: ErrBadValue.Error() + ": " + ph.text + ": " + why, detail: detail, errs: []error{ErrBadValue}}
}

// where names, for a client, where the value of ph is looked for, such as
// `the JSON body field "sku"`.
func (ph *placeholder) where() string {
	switch ph.src {
	case srcPath:
		return fmt.Sprintf("the path parameter %q", ph.name)
	case srcQuery:
		return fmt.Sprintf("the query parameter %q", ph.name)
	case srcHeader:
		return fmt.Sprintf("the header %q", ph.name)
	case srcForm:
		return fmt.Sprintf("the form field %q", ph.name)
	case srcJSON:
		return jsonWhere(ph.name)
	}
	return fmt.Sprintf("the request's %q value (one the server derives from the request, such as its signed-in user)", ph.name)
}

// jsonWhere names the JSON body field at path for a client.
func jsonWhere(path string) string { return fmt.Sprintf("the JSON body field %q", path) }

// missingDetail says, for a client, that the value of ph is absent.
func (ph *placeholder) missingDetail() string {
	if ph.multi {
		array, _, _ := strings.Cut(ph.name, eachStep)
		return fmt.Sprintf("the JSON body has no array %q", array)
	}
	if ph.src == srcCtx {
		return fmt.Sprintf("the request has no %q value (one the server derives from the request, such as its signed-in user)", ph.name)
	}
	return ph.where() + " is missing or empty"
}

// ctxValue renders the context value of a ctx placeholder.
func ctxValue(r Request, ph *placeholder) (string, error) {
	v, ok := r.ContextValue(ph.name)
	if !ok || v == nil {
		return "", nil
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case int:
		return strconv.Itoa(v), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case bool:
		return strconv.FormatBool(v), nil
	}
	rv := reflect.ValueOf(v)
	if s, ok := v.(fmt.Stringer); ok {
		if rv.Kind() == reflect.Pointer && rv.IsNil() {
			return "", nil
		}
		return s.String(), nil
	}
	switch rv.Kind() {
	case reflect.String:
		return rv.String(), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(rv.Int(), 10), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return strconv.FormatUint(rv.Uint(), 10), nil
	case reflect.Bool:
		return strconv.FormatBool(rv.Bool()), nil
	case reflect.Slice:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return string(rv.Bytes()), nil
		}
	}
	return "", badValue(ph, fmt.Sprintf("context value of unsupported type %T", v), ph.where()+" cannot be part of a lock key")
}

// unreserved marks the bytes that escaping keeps: [A-Za-z0-9]. Every other
// byte, '-', '.', '_' and '~' included, is escaped, so a rendered value holds
// only letters, digits, '%' and the '#' of a hash: never a separator (see
// isValueByte).
var unreserved = func() (u [256]bool) {
	for c := 0; c < 256; c++ {
		u[c] = isLetter(byte(c)) || isDigit(byte(c))
	}
	return u
}()

// escapedLen returns the length of v once escaped.
func escapedLen(v string) int {
	n := len(v)
	for i := 0; i < len(v); i++ {
		if !unreserved[v[i]] {
			n += 2
		}
	}
	return n
}

// renderedLen returns the length writeValue writes for v.
func renderedLen(v string, maxLen int) int {
	if n := escapedLen(v); n <= maxLen {
		return n
	}
	return hashedLen
}

// writeValue writes v escaped, or hashed when its escaped form is longer
// than maxLen.
func writeValue(b *strings.Builder, v string, maxLen int) {
	if escapedLen(v) > maxLen {
		sum := sha256.Sum256([]byte(v))
		var h [hashedLen]byte
		h[0] = '#'
		hex.Encode(h[1:], sum[:16])
		b.Write(h[:])
		return
	}
	const upperHex = "0123456789ABCDEF"
	start := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if unreserved[c] {
			continue
		}
		b.WriteString(v[start:i])
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&15])
		start = i + 1
	}
	b.WriteString(v[start:])
}
