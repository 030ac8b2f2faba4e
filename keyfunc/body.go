package keyfunc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// bodyState caches the body and what was parsed from it during one Key or
// Keys call.
type bodyState struct {
	read bool
	buf  []byte
	err  error // reading failed or the body is too large

	jsonDone bool
	jsonObj  map[string]any
	jsonErr  string // why the body is not a JSON object

	formDone bool
	form     url.Values
	formErr  string // why the body is not a form
}

// value returns the raw value of a json or form placeholder, "" when absent.
func (bs *bodyState) value(r *http.Request, maxBody int64, ph *placeholder) (string, error) {
	if ok, err := bs.load(r, maxBody, ph); !ok {
		return "", err
	}
	if ph.src == srcJSON {
		return bs.jsonValue(ph)
	}
	return bs.formValue(r, maxBody, ph)
}

// load reads the body, once per Key or Keys call. It reports false, with an
// error naming ph if reading failed, when there is no body to read from.
func (bs *bodyState) load(r *http.Request, maxBody int64, ph *placeholder) (bool, error) {
	if r == nil {
		return false, nil
	}
	if !bs.read {
		bs.read = true
		bs.buf, bs.err = readBody(r, maxBody)
	}
	if bs.err != nil {
		if errors.Is(bs.err, ErrBodyTooLarge) {
			return false, &requestError{
				msg:    fmt.Sprintf("%v: %s: over %d bytes", ErrBodyTooLarge, ph.text, maxBody),
				detail: fmt.Sprintf("the request body is over %d bytes", maxBody),
				errs:   []error{ErrBodyTooLarge},
			}
		}
		return false, &requestError{
			msg:    fmt.Sprintf("%v: %s: reading body: %v", ErrBadValue, ph.text, bs.err),
			detail: "the request body could not be read",
			errs:   []error{ErrBadValue, bs.err},
		}
	}
	return len(bs.buf) > 0, nil // no body: every field is missing
}

// readBody reads up to maxBody bytes of r.Body and restores r.Body (and
// r.GetBody) so that the handler reads the same bytes. A body longer than
// maxBody yields ErrBodyTooLarge; r.Body then replays what was read followed
// by the rest of the original stream.
func readBody(r *http.Request, maxBody int64) ([]byte, error) {
	orig := r.Body
	if orig == nil || orig == http.NoBody {
		return nil, nil
	}
	limit := maxBody
	if limit < math.MaxInt64 {
		limit++ // one byte more tells a body of exactly maxBody from a longer one
	}
	var buf []byte
	if cl := r.ContentLength; cl > 0 && cl <= maxBody {
		buf = make([]byte, 0, cl+1) // +1: the final read that sees EOF needs no growth
	}
	buf, err := readAll(io.LimitReader(orig, limit), buf)
	if err == nil && int64(len(buf)) > maxBody {
		err = ErrBodyTooLarge
	}
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			err = ErrBodyTooLarge
		}
		r.Body = replayBody{io.MultiReader(bytes.NewReader(buf), orig), orig}
		return nil, err
	}
	_ = orig.Close() // fully read; nothing else will close it
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return buf, nil
}

// replayBody reads what was read already, then the rest of the original body.
type replayBody struct {
	io.Reader
	io.Closer
}

// readAll is io.ReadAll appending to buf.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// jsonObject returns the body decoded as a JSON object, decoding it once.
func (bs *bodyState) jsonObject(ph *placeholder) (map[string]any, error) {
	if !bs.jsonDone {
		bs.jsonDone = true
		bs.jsonObj, bs.jsonErr = decodeObject(bs.buf)
	}
	if bs.jsonErr != "" {
		return nil, badValue(ph, bs.jsonErr, "the request "+bs.jsonErr)
	}
	return bs.jsonObj, nil
}

func (bs *bodyState) jsonValue(ph *placeholder) (string, error) {
	obj, err := bs.jsonObject(ph)
	if err != nil {
		return "", err
	}
	v, found, why := walk(obj, ph.path)
	if why != "" {
		return "", badValue(ph, why, jsonWhere(ph.name)+": "+why)
	}
	if !found {
		return "", nil
	}
	s, ok := scalarText(v)
	if !ok {
		return "", badValue(ph, "value is "+jsonKind(v), jsonWhere(ph.name)+" is "+jsonKind(v)+", not a string, number or boolean")
	}
	return s, nil
}

// values returns the raw values of a json placeholder with [*], one per
// array element, or none when there is no body or no array. It fails when
// the array is empty, longer than maxKeys, or has an element without a
// usable value.
func (bs *bodyState) values(r *http.Request, maxBody int64, ph *placeholder, maxKeys int) ([]string, error) {
	if ok, err := bs.load(r, maxBody, ph); !ok {
		return nil, err
	}
	obj, err := bs.jsonObject(ph)
	if err != nil {
		return nil, err
	}
	each := slices.IndexFunc(ph.path, func(s jsonStep) bool { return s.kind == stepEach })
	array, _, _ := strings.Cut(ph.name, eachStep)
	v, found, why := walk(obj, ph.path[:each])
	if why != "" {
		return nil, badValue(ph, why, jsonWhere(array)+": "+why)
	}
	if !found {
		return nil, nil
	}
	arr, ok := v.([]any)
	switch {
	case !ok:
		return nil, badValue(ph, "the value at [*] is "+jsonKind(v)+", not an array", jsonWhere(array)+" is "+jsonKind(v)+", not an array")
	case len(arr) == 0:
		return nil, missingWhy(ph, "the array is empty", fmt.Sprintf("the JSON body array %q is empty", array))
	case len(arr) > maxKeys:
		return nil, &requestError{
			msg:    fmt.Sprintf("%v: %s: the array has more elements than the limit of %d", ErrTooManyKeys, ph.text, maxKeys),
			detail: fmt.Sprintf("the JSON body array %q has more than %d elements", array, maxKeys),
			errs:   []error{ErrTooManyKeys},
		}
	}
	rest := ph.path[each+1:]
	vals := make([]string, len(arr))
	for i, elem := range arr {
		v, found, why := walk(elem, rest)
		if why != "" {
			return nil, badValue(ph, elemName(ph, i)+": "+why, jsonWhere(elemPath(ph, i))+": "+why)
		}
		if !found {
			return nil, missingWhy(ph, elemName(ph, i), jsonWhere(elemPath(ph, i))+" is missing or empty")
		}
		s, ok := scalarText(v)
		if !ok {
			return nil, badValue(ph, elemName(ph, i)+": value is "+jsonKind(v),
				jsonWhere(elemPath(ph, i))+" is "+jsonKind(v)+", not a string, number or boolean")
		}
		if s == "" {
			return nil, missingWhy(ph, elemName(ph, i), jsonWhere(elemPath(ph, i))+" is missing or empty")
		}
		vals[i] = s
	}
	return vals, nil
}

// elemName names element i of ph's array for an error message, such as
// "at items[2]" for <json:items[*].sku>.
func elemName(ph *placeholder, i int) string {
	array, _, _ := strings.Cut(ph.name, eachStep)
	return "at " + array + "[" + strconv.Itoa(i) + "]"
}

// elemPath is ph's JSON path for element i of its array, such as
// "items[2].sku" for <json:items[*].sku>.
func elemPath(ph *placeholder, i int) string {
	return strings.Replace(ph.name, eachStep, "["+strconv.Itoa(i)+"]", 1)
}

// walk follows the field steps from v. It reports found false when a field
// is absent, and a reason when a parent is not an object or a field is
// ambiguous.
func walk(v any, steps []jsonStep) (_ any, found bool, why string) {
	for _, step := range steps {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, false, "a parent of the field is " + jsonKind(v) + ", not an object"
		}
		if caseVariant(obj, step.field) {
			return nil, false, "a field name in the body differs from it only in case"
		}
		if v, ok = obj[step.field]; !ok {
			return nil, false, ""
		}
	}
	return v, true, ""
}

// scalarText returns the text of a JSON string, number or boolean.
func scalarText(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return string(v), true
	case bool:
		if v {
			return "true", true
		}
		return "false", true
	}
	return "", false
}

// caseVariant reports whether obj has a key other than name that equals it
// case-insensitively. encoding/json matches struct fields that way (the last
// match wins), so a handler might read a different field than the key.
func caseVariant(obj map[string]any, name string) bool {
	for k := range obj {
		if k != name && strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// decodeObject decodes a body that must be exactly one JSON object. The
// reason it returns never quotes the body.
func decodeObject(buf []byte) (map[string]any, string) {
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, "body is not valid JSON"
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, "body is not valid JSON: data after the top-level value"
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, "body is " + jsonKind(v) + ", not a JSON object"
	}
	return obj, ""
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

func (bs *bodyState) formValue(r *http.Request, maxBody int64, ph *placeholder) (string, error) {
	if !bs.formDone {
		bs.formDone = true
		bs.form, bs.formErr = parseForm(r.Header.Get("Content-Type"), bs.buf, maxBody)
	}
	if bs.formErr != "" {
		return "", badValue(ph, bs.formErr, "the request "+bs.formErr)
	}
	if vs := bs.form[ph.name]; len(vs) > 0 {
		return vs[0], nil
	}
	return "", nil
}

// parseForm parses a copy of an urlencoded or multipart body. The reason it
// returns never quotes the body.
func parseForm(contentType string, buf []byte, maxBody int64) (url.Values, string) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return nil, "body is not a form: missing or invalid Content-Type"
	}
	switch mt {
	case "application/x-www-form-urlencoded":
		vs, err := url.ParseQuery(string(buf))
		if err != nil {
			return nil, "body is not a valid urlencoded form"
		}
		return vs, ""
	case "multipart/form-data":
		boundary := params["boundary"]
		if boundary == "" {
			return nil, "body is not a form: multipart Content-Type without boundary"
		}
		// The whole body is in buf, so maxBody keeps every part in memory.
		f, err := multipart.NewReader(bytes.NewReader(buf), boundary).ReadForm(maxBody)
		if err != nil {
			return nil, "body is not a valid multipart form"
		}
		_ = f.RemoveAll()
		return url.Values(f.Value), ""
	}
	return nil, "body is not a form: Content-Type is neither urlencoded nor multipart"
}
