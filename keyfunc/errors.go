package keyfunc

import "errors"

// Sentinel errors. Every error that Parse or Template.Key returns matches one
// of them with errors.Is. Messages name the placeholder as written in the
// template, never a value taken from the request.
var (
	// ErrSyntax means a template or an option is invalid. Parse returns it
	// at route set-up; the message names the problem and its byte offset.
	ErrSyntax = errors.New("keyfunc: invalid template")

	// ErrMissing means a placeholder's value is absent or empty in the
	// request. A middleware answers 400 Bad Request.
	ErrMissing = errors.New("keyfunc: key value missing")

	// ErrBadValue means a value is present but cannot be part of a key: a
	// JSON null, object or array, a context value of an unsupported type, or
	// a body that does not parse as JSON or as a form. A middleware answers
	// 400 Bad Request.
	ErrBadValue = errors.New("keyfunc: key value unusable")

	// ErrBodyTooLarge means the body needed for json or form placeholders is
	// longer than the template's MaxBodyBytes. A middleware answers
	// 413 Content Too Large.
	ErrBodyTooLarge = errors.New("keyfunc: request body too large")
)
