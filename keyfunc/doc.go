// Package keyfunc derives lock keys from requests. A route declares a key
// template such as "sku:<id>"; Parse parses it once, at route set-up, and
// Template.Key renders the key of each request:
//
//	t, err := keyfunc.Parse("sku:<id>")       // start-up: errors wrap ErrSyntax
//	key, err := t.Key(keyfunc.HTTPRequest(r)) // per request: "sku:42"
//
// # Grammar
//
//	template    = 1*( literal / placeholder )
//	placeholder = "<" [ source ":" ] name ">"
//	source      = "path" / "query" / "header" / "form" / "json" / "ctx" ; default path
//
// The sources and the names they accept:
//
//	<id>, <path:id>   path parameter ({id} of "POST /skus/{id}"); name [A-Za-z_][A-Za-z0-9_]*
//	<query:name>      first URL query value; name: printable ASCII except '<', '>' and space
//	<header:Name>     request header (r.Header.Get); name: RFC 7230 token characters
//	<form:name>       first value field of an urlencoded or multipart form body; name as query
//	<json:a.b.c>      field of the JSON body object, a dotted path through nested objects;
//	                  each segment: printable ASCII except '<', '>', '.', '[', ']' and space
//	<ctx:name>        Request.ContextValue(name), set by an earlier middleware; name as query
//
// Literals are printable ASCII except '<' and '>': no space or control
// characters. Braces are plain literals, so a Redis Cluster hash tag can be
// written around a literal. A template has at most 512 bytes; one without
// placeholders is valid and gives every request of the route the same key. Two placeholders must be separated by a literal:
// "<a><b>" is ambiguous and rejected. Array steps in json paths (such as
// items[*].sku) are not supported yet; '[' and ']' are syntax errors.
//
// Examples:
//
//	sku:<id>
//	user_balance_update:<ctx:user>
//	order:<header:X-Tenant>:<json:order.id>
//	{stock}:<query:warehouse>:<form:sku>
//
// Parse errors wrap ErrSyntax and name the problem and its byte offset:
//
//	keyfunc: invalid template: "sku:<id": unclosed placeholder at offset 4
//
// # Rendering
//
// Key replaces each placeholder by its value, escaped: bytes in
// [A-Za-z0-9._~-] stay, every other byte becomes %XX (uppercase hex). A value
// therefore never contains ':', '/', '{', '}' or a space, so no request can
// forge the structure of a key or add a Redis hash tag. An escaped value
// longer than MaxValueLen (default 64) is replaced by '#' and the lowercase
// hex of the first 16 bytes of the SHA-256 of the raw value; '#' never appears
// in an escaped value, so hashed and plain values cannot collide. Keys carry
// no prefix: the Locker adds its own.
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
// # Request bodies
//
// Templates with json or form placeholders (see Template.NeedsBody) read the
// body at most once per Key call, bounded by MaxBodyBytes, and then restore
// it: Key sets r.Body and r.GetBody of the *http.Request in place to replay
// the same bytes, so the handler reads the body as if nobody had.
package keyfunc
