package keyfunc

import "errors"

// Sentinel errors. Every error that Parse, Template.Key or Template.Keys
// returns matches one of them with errors.Is. Messages name the placeholder
// as written in the template, never a value taken from the request.
var (
	// ErrSyntax means a template or an option is invalid. Parse returns it
	// at route set-up; the message names the problem and its byte offset.
	// Key returns it for a template not made by Parse or one with a [*],
	// which only Keys renders.
	ErrSyntax = errors.New("keyfunc: invalid template")

	// ErrMissing means a placeholder's value is absent or empty in the
	// request, or the array at a [*] is. A middleware answers 400 Bad Request.
	ErrMissing = errors.New("keyfunc: key value missing")

	// ErrBadValue means a value is present but cannot be part of a key: a
	// JSON null, object or array, a non-array at a [*], a context value of
	// an unsupported type, or a body that does not parse as JSON or as a
	// form. A middleware answers 400 Bad Request.
	ErrBadValue = errors.New("keyfunc: key value unusable")

	// ErrBodyTooLarge means the body needed for json or form placeholders is
	// longer than the template's MaxBodyBytes. A middleware answers
	// 413 Content Too Large.
	ErrBodyTooLarge = errors.New("keyfunc: request body too large")

	// ErrTooManyKeys means the array at a template's [*] has more elements
	// than the template's MaxKeys; Template.Keys then renders none. A
	// middleware answers 413 Content Too Large.
	ErrTooManyKeys = errors.New("keyfunc: too many keys")
)

// RequestDetail returns what err, an error of Template.Key or
// Template.Keys, says is wrong with the request, in words for the request's
// client: where the value was looked for and what was wrong with it, such as
//
//	the JSON body field "sku" is missing or empty
//
// It never holds a value from the request nor a Go package name; Error
// keeps the placeholder as written, for logs. RequestDetail returns "" when
// err (or an error it wraps) is not such an error.
func RequestDetail(err error) string {
	var re *requestError
	if errors.As(err, &re) {
		return re.detail
	}
	return ""
}

// requestError is a request that yields no key: it wraps one of the
// sentinels (and the cause, if any), and says what is wrong both for logs
// (msg) and for the request's client (detail).
type requestError struct {
	msg    string
	detail string
	errs   []error // the sentinel, then the cause if any
}

func (e *requestError) Error() string   { return e.msg }
func (e *requestError) Unwrap() []error { return e.errs }
