// Package keyfunc derives lock keys from requests. A route declares a key
// template such as "sku:<id>"; Parse parses it once, at route set-up, and
// Template.Key renders the key of each request:
//
//	t, err := keyfunc.Parse("sku:<id>")       // start-up: errors wrap ErrSyntax
//	key, err := t.Key(keyfunc.HTTPRequest(r)) // per request: "sku:42"
//
// A template with a [*] in a json path yields one key per array element, and
// Template.Keys renders them all (see "Several keys").
//
// # Grammar
//
//	template    = 1*( literal / placeholder )
//	literal     = 1*( byte / "\" ( "{" / "}" / ":" / "\" ) ) ; see "Router syntax and escapes"
//	placeholder = "<" [ source ":" ] name ">"
//	source      = "path" / "query" / "header" / "form" / "json" / "ctx" ; default path
//	json-path   = segment *( "." segment )  ; the name of a json placeholder
//	segment     = field [ "[*]" ]           ; at most one "[*]" per template
//
// The sources and the names they accept:
//
//	<id>, <path:id>   path parameter ({id} of "POST /skus/{id}"); name [A-Za-z_][A-Za-z0-9_]*
//	<query:name>      first URL query value; name: printable ASCII except '<', '>' and space
//	<header:Name>     request header (r.Header.Get); name: RFC 7230 token characters
//	<form:name>       first value field of an urlencoded or multipart form body; name as query
//	<json:a.b.c>      field of the JSON body object, a dotted path through nested objects;
//	                  each field: printable ASCII except '<', '>', '.', '[', ']' and space
//	<json:a[*].b>     field b of every element of the array a, one key each; items[*] reads
//	                  an array of scalars (see "Several keys")
//	<ctx:name>        Request.ContextValue(name), set by an earlier middleware; name as query
//
// Literals are printable ASCII except '<' and '>': no space or control
// characters; a backslash escapes (see "Router syntax and escapes"). A
// template has at most 512 bytes; one without placeholders is valid and
// gives every request of the route the same key.
//
// A placeholder must touch only separators: the literal byte just before and
// just after it, if any, must not be a letter, a digit, '%' or '#', the bytes
// a rendered value is made of (see "No forged keys"). So "sku:<id>",
// "order.<id>.lines" and "<a>-<b>" are valid; "sku<id>", "<id>v2" and
// "<a>%<b>" are rejected, and so is "<a><b>".
//
// [*] is the only array step: "[0]", "[]" or a '[' without a field before it
// are syntax errors. A template has at most one [*], across all its
// placeholders, so that it never yields the product of two arrays. Query,
// form and ctx names may hold brackets but not "[*]".
//
// Examples:
//
//	sku:<id>
//	user_balance_update:<ctx:user>
//	order:<header:X-Tenant>:<json:order.id>
//	\{stock}:<query:warehouse>:<form:sku>
//	sku:<json:items[*].sku>
//
// Parse errors wrap ErrSyntax and name the problem and its byte offset:
//
//	keyfunc: invalid template: "sku:<id": unclosed placeholder at offset 4
//
// # Router syntax and escapes
//
// Router syntax is an error, since as a literal it would give every request
// the same key: "{name}" or "{name...}" anywhere, and ":name" at the start of
// the template or right after a ':' or a '/', where name is
// [A-Za-z_][A-Za-z0-9_]*. So acct:{id}, acct::id, acct/:id and :id are
// rejected, with a message that shows the reqlock spelling:
//
//	keyfunc: invalid template: "acct:{id}": router syntax {id} at offset 5 (write <id> for a path parameter, or \{id} for literal text)
//
// A word after a single ':' is a literal, as in tenant:acme:<id> or acct:id
// (mind that the latter has no placeholder), and so are braces around
// anything but a bare name, as in {<id>} or cart:{<json:cart>}, a Redis
// Cluster hash tag around a value.
//
// A backslash escapes the next byte, which must be '{', '}', ':' or '\', and
// the key holds that byte alone: \{stock}:<id> renders {stock}:42 (a hash
// tag around a literal), acct:\:id renders acct::id, and \\ renders one
// backslash. Any other byte after a backslash is an error. In Go source, a
// raw string keeps the template as written: `\{stock}:<id>`.
//
// # Rendering
//
// Key replaces each placeholder by its value, escaped: letters and digits
// ([A-Za-z0-9]) stay, every other byte becomes %XX (uppercase hex), '-', '.',
// '_' and '~' included: "A-1" renders "A%2D1". An escaped value longer than
// MaxValueLen (default 64) is replaced by '#' and the lowercase hex of the
// first 16 bytes of the SHA-256 of the raw value; '#' never appears in an
// escaped value, so hashed and plain values cannot collide. Keys carry no
// prefix: the Locker adds its own.
//
// A JSON string renders as itself, a number as its literal text (so 1.0 and 1
// are different keys: key on strings or integers), true and false as "true"
// and "false". A context value
// may be a string, []byte, fmt.Stringer, any int or uint kind, or a bool.
//
// A value that is absent or empty makes Key fail with ErrMissing, never a key
// with an empty part. A JSON null, object or array, a context value of
// another type, or a body that is not a JSON object or a form gives
// ErrBadValue. A body longer than MaxBodyBytes (default 1 MiB) gives
// ErrBodyTooLarge. A request without a body has every json and form field
// missing. Error messages name the placeholder as written, such as
// "keyfunc: key value missing: <json:sku>", and never a request value, so
// they can be shown to the client.
//
// A key is only as good as its agreement with what the handler reads, so Key
// refuses two ambiguous shapes with ErrBadValue: a JSON object with a field
// name that differs from a json path segment only in case (encoding/json
// matches struct fields case-insensitively, and the last match wins), and a
// form field that the URL query also carries with another value
// (r.FormValue reads the query before a multipart body).
//
// # Several keys
//
// A json path with [*] reads every element of an array, so a route can lock
// every SKU of a cart: on the body
//
//	{"items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}
//
// "sku:<json:items[*].sku>" yields the keys "sku:A" and "sku:B". Such a
// template is Multi; Template.Keys renders its keys, one per element in the
// array's order (the caller sorts and removes duplicates), and Key refuses it
// with ErrSyntax. Keys renders a template without [*] as its one key.
//
// Each element's value follows the rules of a single JSON value above, and
// every element must have one: an absent or empty array, or an element
// without the field or with an empty value, gives ErrMissing; a value at [*]
// that is not an array, or an element's null, object or array value, gives
// ErrBadValue. Messages name the element by its index, as in
// "keyfunc: key value missing: <json:items[*].sku>: at items[1]". An array
// with more elements than MaxKeys (default 64) gives ErrTooManyKeys before
// any element is read, so a hostile body cannot make Keys build a long list.
//
// # No forged keys
//
// A rendered value is made of letters, digits, '%' and '#' only; call every
// other literal byte, such as ':', '.', '-', '/', '{' or '}', a separator.
// Since a placeholder touches only separators, a value never contains one
// and never runs into a neighbouring literal. Cut a key at its separators:
// the separators are exactly the template's, in order, and between them are
// its words, one per slot, where a slot is a placeholder or a literal word (a
// maximal run of letters, digits, '%' and '#' in a literal). Hence:
//
//   - Within one template, a key determines its values: different values give
//     different keys (barring a collision of the 128-bit hash). With
//     "<query:a>-<query:b>", a=x-y b=z renders "x%2Dy-z" and a=x b=y-z
//     renders "x-y%2Dz".
//   - Two templates render the same key only if they have the same separators
//     in the same order with the same number of slots, and in every slot two
//     literal words are equal, two values are equal, or a literal word equals
//     the other template's rendered value. No value makes "order.<id>" render
//     a key of "order.<id>.lines", or "k:<x>" one of "k:<x>:<y>".
//
// Keys renders each element in the slot of its placeholder, so each key of a
// Multi template is the key that template would render if its [*]
// placeholder read that element alone, and all of the above holds for every
// key: two elements give the same key only if their values are equal, and
// the keys of "sku:<json:items[*].sku>" meet those of "sku:<id>" only where
// an element equals id, by design.
//
// What is not guaranteed: templates that line up slot for slot share a key
// space, by design. "sku:<id>" and "sku:<json:sku>" share it on purpose, so
// that two routes lock the same SKU; "k:ab" or "k:ab:<y>" meets "k:<x>" or
// "k:<x>:<y>" when x is "ab". A literal word meets a value only if it reads
// like a rendered value, so '%' and '#' may appear in literals away from
// placeholders: they add no collision that letters do not ("k:%3A" meets
// "k:<x>" with x ":" as "k:ab" does with x "ab"; "k:%41" or "k:%zz", which no
// value renders, meets none). Give routes that must not share locks
// different separators or different literal words in the same slot, such as
// "sku:<id>" and "sku-lines:<id>".
//
// # Request bodies
//
// Templates with json or form placeholders (see Template.NeedsBody) read the
// body at most once per Key or Keys call, bounded by MaxBodyBytes, and then
// restore it: Key and Keys set r.Body and r.GetBody of the *http.Request in
// place to replay the same bytes, so the handler reads the body as if nobody
// had.
package keyfunc
