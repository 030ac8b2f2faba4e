package keyfunc

import (
	"fmt"
)

// Render returns the key the template renders from values, one per
// placeholder in the order they appear: the key Key (or, for the element at
// [*] of a Multi template, Keys) renders for a request that carries those
// values, escaped or hashed alike. A handler uses it to find a lock's key by
// the values it came from, for example the fence of one account of a
// transfer:
//
//	key, err := transferFrom.Render(req.From) // "acct:<json:from>"
//	fence, ok := lock.FenceOf(key)
//
// A JSON number or boolean is passed as its JSON text, such as "42".
// Render returns an error wrapping ErrMissing for an empty value, and one
// wrapping ErrBadValue when the number of values is not the number of
// placeholders; on a Template not made by Parse it returns an error wrapping
// ErrSyntax.
func (t *Template) Render(values ...string) (string, error) {
	if t == nil || len(t.parts) == 0 {
		return "", fmt.Errorf("%w: template not parsed (use Parse)", ErrSyntax)
	}
	if len(values) != t.holes {
		return "", fmt.Errorf("%w: template %q has %d placeholders, Render got %d values",
			ErrBadValue, t.raw, t.holes, len(values))
	}
	n := t.literalLen
	i := 0
	for _, p := range t.parts {
		if p.ph == nil {
			continue
		}
		if values[i] == "" {
			return "", missing(p.ph)
		}
		n += renderedLen(values[i], t.maxValueLen)
		i++
	}
	return t.render(values, n), nil
}

// Render parses template with opts and renders it from values: see
// Template.Render. Parse a template once and call its Render method where
// keys are rendered per request.
func Render(template string, values []string, opts ...Option) (string, error) {
	t, err := Parse(template, opts...)
	if err != nil {
		return "", err
	}
	return t.Render(values...)
}
