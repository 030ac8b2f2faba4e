package routetable

import "errors"

// ErrInvalid is wrapped by every error that rejects a spec, a route or a
// route table.
var ErrInvalid = errors.New("reqlock/routetable: invalid configuration")

// Error is one problem of a spec, a route or a table, located at Where. It
// wraps ErrInvalid and Err. The functions that find several problems return
// them joined (errors.Join), one *Error each.
type Error struct {
	// Where locates the problem: "spec column 7", a table file's
	// "routes.yaml:4", the source given to ParseEntry, or "".
	Where string
	// Line is the problem's line in its table file, or 0.
	Line int
	// Problem says what is wrong, such as `wait: "2x" is not a duration
	// (such as 2s or 500ms)`.
	Problem string
	// Err is the cause, such as a keyfunc error wrapping keyfunc.ErrSyntax
	// or a file's read error, or nil.
	Err error
}

// Error returns ErrInvalid's message and Detail.
func (e *Error) Error() string { return ErrInvalid.Error() + ": " + e.Detail() }

// Detail is the message without ErrInvalid's prefix: "Where: Problem", or
// Problem when Where is empty. Package middleware puts its own prefix in
// front of it.
func (e *Error) Detail() string {
	if e.Where == "" {
		return e.Problem
	}
	return e.Where + ": " + e.Problem
}

// Unwrap returns ErrInvalid and Err, if any.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalid}
	}
	return []error{ErrInvalid, e.Err}
}
