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
