package keyfunc

import (
	"fmt"
	"net/textproto"
	"slices"
	"strings"
)

// maxTemplateLen is the longest template Parse accepts, in bytes.
const maxTemplateLen = 512

// separatorHint explains why a placeholder needs a separator on each side.
const separatorHint = "a value may contain letters, digits, '%' and '#': separate them with another character, such as ':'"

// source is where a placeholder's value comes from.
type source uint8

const (
	srcPath source = iota
	srcQuery
	srcHeader
	srcForm
	srcJSON
	srcCtx
)

var sourceNames = [...]string{
	srcPath:   "path",
	srcQuery:  "query",
	srcHeader: "header",
	srcForm:   "form",
	srcJSON:   "json",
	srcCtx:    "ctx",
}

const validSources = "want path, query, header, form, json or ctx"

func (s source) String() string { return sourceNames[s] }

// stepKind is the kind of one step of a json path.
type stepKind uint8

const (
	stepField stepKind = iota // a field of an object
	stepEach                  // [*]: every element of an array
)

// eachStep is how a stepEach is written.
const eachStep = "[*]"

// jsonStep is one step of a json placeholder's path.
type jsonStep struct {
	kind  stepKind
	field string // stepField only
}

// placeholder is one parsed <source:name>.
type placeholder struct {
	src   source
	name  string     // header names are canonical
	path  []jsonStep // json only
	text  string     // as written, such as "<json:sku>"
	multi bool       // path has a stepEach
}

// part is a literal or a placeholder.
type part struct {
	literal string
	ph      *placeholder
}

// Template is a parsed key template. It is immutable and safe for concurrent
// use. Create it with Parse or MustParse; a zero Template renders no key.
type Template struct {
	raw          string
	parts        []part
	literalLen   int
	holes        int
	needsBody    bool
	multi        bool // a placeholder has a [*]; at most one does
	maxBodyBytes int64
	maxValueLen  int
	maxKeys      int
}

// Parse parses a key template; see the package documentation for the
// grammar. Options default to DefaultMaxBodyBytes, DefaultMaxValueLen and
// DefaultMaxKeys.
// Every error wraps ErrSyntax and names the problem and its byte offset, or
// the invalid option.
func Parse(template string, opts ...Option) (*Template, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	t := &Template{raw: template, maxBodyBytes: o.maxBodyBytes, maxValueLen: o.maxValueLen, maxKeys: o.maxKeys}
	if err := t.parse(); err != nil {
		return nil, err
	}
	return t, nil
}

// MustParse is like Parse but panics when Parse returns an error. Use it at
// start-up only.
func MustParse(template string, opts ...Option) *Template {
	t, err := Parse(template, opts...)
	if err != nil {
		panic(err)
	}
	return t
}

// String returns the template as written.
func (t *Template) String() string {
	if t == nil {
		return ""
	}
	return t.raw
}

// MaxLen returns the length in bytes of the longest key the template can
// render: its literals, and each placeholder's value at its longest (the
// longest escaped value MaxValueLen allows, or a hash). A store with a key
// length limit can refuse a template at start-up by it.
func (t *Template) MaxLen() int {
	if t == nil {
		return 0
	}
	return t.literalLen + t.holes*max(t.maxValueLen, hashedLen)
}

// NeedsBody reports whether the template reads the request body, that is
// whether it has json or form placeholders.
func (t *Template) NeedsBody() bool { return t != nil && t.needsBody }

// Multi reports whether the template can yield several keys, that is whether
// a json placeholder has a [*] step. Render such a template with Keys; Key
// refuses it.
func (t *Template) Multi() bool { return t != nil && t.multi }

// PathNames returns the names of the template's path placeholders (<id>,
// <path:id>), each once, in order of first appearance, so that a caller can
// check them against a route's parameters at start-up. It returns nil when
// there are none.
func (t *Template) PathNames() []string {
	if t == nil {
		return nil
	}
	var names []string
	for _, p := range t.parts {
		if p.ph != nil && p.ph.src == srcPath && !slices.Contains(names, p.ph.name) {
			names = append(names, p.ph.name)
		}
	}
	return names
}

func (t *Template) parse() error {
	s := t.raw
	if s == "" {
		return t.errAt(0, "empty template", "")
	}
	if len(s) > maxTemplateLen {
		return fmt.Errorf("%w: template is %d bytes, longer than the %d-byte limit at offset %d",
			ErrSyntax, len(s), maxTemplateLen, maxTemplateLen)
	}
	placeholderEnd := -1 // offset just after the last placeholder
	for i := 0; i < len(s); {
		switch c := s[i]; c {
		case '<':
			if i == placeholderEnd {
				return t.errAt(i, "adjacent placeholders", "separate them with a literal")
			}
			end := i + 1
			for end < len(s) && s[end] != '>' && s[end] != '<' {
				end++
			}
			if end == len(s) || s[end] == '<' {
				return t.errAt(i, "unclosed placeholder", "")
			}
			if end == i+1 {
				return t.errAt(i, "empty placeholder", "")
			}
			if i > 0 && isValueByte(s[i-1]) {
				return t.errAt(i-1, "placeholder "+s[i:end+1]+" preceded by "+quoteByte(s[i-1]), separatorHint)
			}
			ph, err := t.parsePlaceholder(i, end)
			if err != nil {
				return err
			}
			if end+1 < len(s) && isValueByte(s[end+1]) {
				return t.errAt(end+1, "placeholder "+ph.text+" followed by "+quoteByte(s[end+1]), separatorHint)
			}
			t.parts = append(t.parts, part{ph: ph})
			t.holes++
			t.needsBody = t.needsBody || ph.src == srcJSON || ph.src == srcForm
			i = end + 1
			placeholderEnd = i
		case '>':
			return t.errAt(i, "stray '>'", "")
		default:
			lit, end, err := t.parseLiteral(i)
			if err != nil {
				return err
			}
			t.parts = append(t.parts, part{literal: lit})
			t.literalLen += len(lit)
			i = end
		}
	}
	return nil
}

// escapable holds the bytes a backslash escapes in a literal: the bytes of
// router syntax, and the backslash itself.
const escapable = `{}:\`

// parseLiteral parses the literal that starts at offset start and runs to the
// next '<' or '>' or the end, and returns it unescaped and the offset just
// after it. It rejects router syntax (see isRouterSyntax) and an escape of a
// byte other than those of escapable.
func (t *Template) parseLiteral(start int) (lit string, end int, err error) {
	s := t.raw
	var b strings.Builder // the literal unescaped, once it has an escape
	i := start
	for ; i < len(s) && s[i] != '<' && s[i] != '>'; i++ {
		c := s[i]
		if !isLiteralByte(c) {
			return "", 0, t.errAt(i, "invalid character "+quoteByte(c)+" in literal", "")
		}
		if c == '\\' {
			if i+1 == len(s) || strings.IndexByte(escapable, s[i+1]) < 0 {
				next := "the end"
				if i+1 < len(s) {
					next = quoteByte(s[i+1])
				}
				return "", 0, t.errAt(i, "backslash before "+next, `a backslash escapes only '{', '}', ':' and '\': write \\ for a backslash`)
			}
			if b.Len() == 0 {
				b.WriteString(s[start:i])
			}
			i++
			b.WriteByte(s[i])
			continue
		}
		if name, n := t.routerSyntax(i); n > 0 {
			return "", 0, t.errAt(i, "router syntax "+s[i:i+n], "write <"+name+"> for a path parameter, or \\"+s[i:i+n]+" for literal text")
		}
		if b.Len() > 0 {
			b.WriteByte(c)
		}
	}
	if b.Len() > 0 {
		return b.String(), i, nil
	}
	return s[start:i], i, nil
}

// routerSyntax reports whether an unescaped parameter of a router's syntax
// starts at offset i of the template: "{name}" or "{name...}" anywhere, or
// ":name" at the start of the template or right after an unescaped ':' or
// '/', where a name is [A-Za-z_][A-Za-z0-9_]*. It returns the name and the
// length of the parameter, or 0. A ':name' elsewhere, such as the "acme" of
// "tenant:acme:<id>", is a literal word.
func (t *Template) routerSyntax(i int) (name string, n int) {
	s := t.raw
	switch s[i] {
	case '{':
		name = routerName(s[i+1:])
		rest := s[i+1+len(name):]
		switch {
		case name == "":
			return "", 0
		case strings.HasPrefix(rest, "}"):
			return name, len(name) + 2
		case strings.HasPrefix(rest, "...}"):
			return name, len(name) + 5
		}
	case ':':
		if i > 0 && (s[i-1] != ':' && s[i-1] != '/' || escapedAt(s, i-1)) {
			return "", 0
		}
		if name = routerName(s[i+1:]); name != "" {
			return name, len(name) + 1
		}
	}
	return "", 0
}

// routerName returns the longest prefix of s that is a router parameter name,
// [A-Za-z_][A-Za-z0-9_]*, or "".
func routerName(s string) string {
	if s == "" || isDigit(s[0]) {
		return ""
	}
	n := 0
	for n < len(s) && isPathNameByte(s[n]) {
		n++
	}
	return s[:n]
}

// escapedAt reports whether the byte at offset i of a literal is escaped:
// whether an odd number of backslashes precede it.
func escapedAt(s string, i int) bool {
	k := 0
	for i-1-k >= 0 && s[i-1-k] == '\\' {
		k++
	}
	return k%2 == 1
}

// parsePlaceholder parses s[open:close], where s[open] is '<' and s[close]
// is '>'.
func (t *Template) parsePlaceholder(open, close int) (*placeholder, error) {
	body := t.raw[open+1 : close]
	ph := &placeholder{src: srcPath, name: body, text: t.raw[open : close+1]}
	nameOff := open + 1
	if colon := strings.IndexByte(body, ':'); colon >= 0 {
		src, ok := lookupSource(body[:colon])
		if !ok {
			if colon == 0 {
				return nil, t.errAt(open+1, "empty source", validSources)
			}
			return nil, t.errAt(open+1, fmt.Sprintf("unknown source %q", body[:colon]), validSources)
		}
		ph.src, ph.name = src, body[colon+1:]
		nameOff += colon + 1
	}
	if ph.name == "" {
		return nil, t.errAt(nameOff, "empty "+ph.src.String()+" name", "")
	}
	var bad int // offset in name of the first invalid byte, or -1
	switch ph.src {
	case srcPath:
		if isDigit(ph.name[0]) {
			return nil, t.errAt(nameOff, "path name starts with a digit", "")
		}
		bad = invalidIndex(ph.name, isPathNameByte)
	case srcHeader:
		bad = invalidIndex(ph.name, isTokenByte)
		ph.name = textproto.CanonicalMIMEHeaderKey(ph.name)
	case srcJSON:
		return ph, t.parseJSONPath(ph, nameOff)
	default: // query, form, ctx
		bad = invalidIndex(ph.name, isNameByte)
	}
	if bad >= 0 {
		c := t.raw[nameOff+bad]
		return nil, t.errAt(nameOff+bad, "invalid character "+quoteByte(c)+" in "+ph.src.String()+" name", "")
	}
	// A query, form or ctx name may hold brackets, but "[*]" would read as
	// an array step that only json paths have.
	if j := strings.Index(ph.name, eachStep); j >= 0 {
		return nil, t.errAt(nameOff+j, eachStep+" in "+ph.src.String()+" name", "only json paths have array steps")
	}
	return ph, nil
}

// parseJSONPath splits ph.name, which starts at offset off, into steps:
// segments separated by '.', each a field name optionally followed by [*].
func (t *Template) parseJSONPath(ph *placeholder, off int) error {
	name := ph.name
	for i := 0; ; i++ { // i is the start of a segment
		start := i
		for i < len(name) && isJSONFieldByte(name[i]) {
			i++
		}
		if i < len(name) && name[i] != '.' && name[i] != '[' {
			if name[i] == ']' {
				return t.errAt(off+i, "stray ']' in json path", "")
			}
			return t.errAt(off+i, "invalid character "+quoteByte(name[i])+" in json path", "")
		}
		if i == start {
			if i < len(name) && name[i] == '[' {
				return t.errAt(off+i, eachStep+" without a field name in json path", "write field[*]")
			}
			return t.errAt(off+i, "empty segment in json path", "")
		}
		ph.path = append(ph.path, jsonStep{kind: stepField, field: name[start:i]})
		stepped := false
		for i < len(name) && name[i] == '[' {
			if err := t.parseEachStep(ph, off, i); err != nil {
				return err
			}
			i += len(eachStep)
			stepped = true
		}
		if i == len(name) {
			return nil
		}
		if stepped && name[i] != '.' {
			return t.errAt(off+i, "invalid character "+quoteByte(name[i])+" after "+eachStep+" in json path", "want '.' or the end of the path")
		}
	}
}

// parseEachStep parses the array step at ph.name[i], a '[', which is at
// offset off+i.
func (t *Template) parseEachStep(ph *placeholder, off, i int) error {
	rest := ph.name[i:]
	if !strings.HasPrefix(rest, eachStep) {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return t.errAt(off+i, "unclosed '[' in json path", "")
		}
		return t.errAt(off+i, "invalid array step "+rest[:end+1]+" in json path", "only [*] is supported")
	}
	// Two [*] would yield a key per combination of elements.
	if t.multi {
		return t.errAt(off+i, "a template may have at most one "+eachStep, "")
	}
	t.multi, ph.multi = true, true
	ph.path = append(ph.path, jsonStep{kind: stepEach})
	return nil
}

// errAt returns a syntax error for the problem at byte offset off, with an
// optional hint in parentheses.
func (t *Template) errAt(off int, problem, hint string) error {
	if hint != "" {
		return fmt.Errorf("%w: %q: %s at offset %d (%s)", ErrSyntax, t.raw, problem, off, hint)
	}
	return fmt.Errorf("%w: %q: %s at offset %d", ErrSyntax, t.raw, problem, off)
}

func lookupSource(s string) (source, bool) {
	for i, n := range sourceNames {
		if n == s {
			return source(i), true
		}
	}
	return 0, false
}

// quoteByte renders c for an error message: 'x' when printable ASCII, else
// its hex value.
func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02X", c)
}

func invalidIndex(s string, valid func(byte) bool) int {
	for i := 0; i < len(s); i++ {
		if !valid(s[i]) {
			return i
		}
	}
	return -1
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// isLiteralByte reports whether c may appear in a literal: printable ASCII
// except '<', '>' and space.
func isLiteralByte(c byte) bool { return c > ' ' && c < 0x7f && c != '<' && c != '>' }

// isValueByte reports whether c can appear in a rendered value: a letter or a
// digit, which escaping keeps, the '%' of an escape, or the '#' of a hashed
// value. The other literal bytes are separators, which no value contains.
//
// Only the bytes next to a placeholder must be separators. Then a key cuts
// back, at its separators, into its template's literal words and values, so
// two keys can be equal only slot by slot. '%' and '#' elsewhere in a literal
// stay allowed: such a word can equal a value only in the same slot of a
// template with the same separators, which a word of letters can as well
// ("k:%3A" and "k:<x>" with x ":", like "k:ab" and "k:<x>" with x "ab").
func isValueByte(c byte) bool { return isLetter(c) || isDigit(c) || c == '%' || c == '#' }

// isNameByte reports whether c may appear in a query, form or ctx name.
func isNameByte(c byte) bool { return isLiteralByte(c) }

func isPathNameByte(c byte) bool { return isLetter(c) || isDigit(c) || c == '_' }

// isTokenByte reports whether c is an RFC 7230 tchar.
func isTokenByte(c byte) bool {
	return isLetter(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func isJSONFieldByte(c byte) bool {
	return isLiteralByte(c) && c != '.' && c != '[' && c != ']'
}
