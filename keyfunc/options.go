package keyfunc

import "fmt"

// Defaults and limits of a Template's options, written in one place.
const (
	// DefaultMaxBodyBytes bounds the body read for json and form
	// placeholders: 1 MiB.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxValueLen is the escaped length above which a value is
	// replaced by its hash.
	DefaultMaxValueLen = 64
	// DefaultMaxKeys is the most keys Template.Keys renders for one request.
	DefaultMaxKeys = 64
	// MinMaxValueLen is the least n WithMaxValueLen accepts.
	MinMaxValueLen = 16
)

// Option configures a Template at Parse.
type Option func(*options)

type options struct {
	maxBodyBytes int64
	maxValueLen  int
	maxKeys      int
}

func defaultOptions() options {
	return options{maxBodyBytes: DefaultMaxBodyBytes, maxValueLen: DefaultMaxValueLen, maxKeys: DefaultMaxKeys}
}

// WithMaxBodyBytes bounds the request body read for json and form
// placeholders; a longer body makes Key fail with ErrBodyTooLarge. n must be
// greater than 0, else Parse returns an error wrapping ErrSyntax. Default
// DefaultMaxBodyBytes (1 MiB).
func WithMaxBodyBytes(n int64) Option { return func(o *options) { o.maxBodyBytes = n } }

// WithMaxValueLen sets the escaped length above which a value is replaced by
// "#" and the hex of a hash of the raw value, which bounds the key's length.
// n must be at least MinMaxValueLen (16), else Parse returns an error
// wrapping ErrSyntax. Default DefaultMaxValueLen (64).
func WithMaxValueLen(n int) Option { return func(o *options) { o.maxValueLen = n } }

// WithMaxKeys caps the keys Template.Keys renders for one request: when the
// array at a template's [*] has more than n elements, Keys fails with
// ErrTooManyKeys. n must be at least 1, else Parse returns an error wrapping
// ErrSyntax. Default DefaultMaxKeys (64).
func WithMaxKeys(n int) Option { return func(o *options) { o.maxKeys = n } }

func (o options) validate() error {
	if o.maxBodyBytes <= 0 {
		return fmt.Errorf("%w: option WithMaxBodyBytes(%d): must be greater than 0", ErrSyntax, o.maxBodyBytes)
	}
	if o.maxValueLen < MinMaxValueLen {
		return fmt.Errorf("%w: option WithMaxValueLen(%d): must be at least %d", ErrSyntax, o.maxValueLen, MinMaxValueLen)
	}
	if o.maxKeys < 1 {
		return fmt.Errorf("%w: option WithMaxKeys(%d): must be at least 1", ErrSyntax, o.maxKeys)
	}
	return nil
}
