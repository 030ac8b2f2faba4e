package keyfunc

import "net/http"

// Request is the framework-neutral view of a request that templates read.
// Adapters for routers implement it; HTTPRequest adapts a plain
// *http.Request.
type Request interface {
	// HTTPRequest returns the underlying request, read by query, header,
	// form and json placeholders. It may return nil, in which case those
	// placeholders are missing.
	HTTPRequest() *http.Request
	// PathValue returns the path parameter name, or "" when absent.
	PathValue(name string) string
	// ContextValue returns a value an earlier middleware stored for this
	// request under name, read by ctx placeholders.
	ContextValue(name string) (any, bool)
}

// ContextKey is the context key type for values that net/http middleware
// puts in the request context for <ctx:name> placeholders:
//
//	ctx = context.WithValue(ctx, keyfunc.ContextKey("tenant"), "acme")
type ContextKey string

// HTTPRequest adapts a plain *http.Request. PathValue uses r.PathValue (the
// wildcards of Go 1.22 ServeMux patterns such as "POST /skus/{id}"), and
// ContextValue uses r.Context().Value(ContextKey(name)). A nil r is a request
// with no values.
func HTTPRequest(r *http.Request) Request { return stdRequest{r} }

type stdRequest struct{ r *http.Request }

func (s stdRequest) HTTPRequest() *http.Request { return s.r }

func (s stdRequest) PathValue(name string) string {
	if s.r == nil {
		return ""
	}
	return s.r.PathValue(name)
}

func (s stdRequest) ContextValue(name string) (any, bool) {
	if s.r == nil {
		return nil, false
	}
	v := s.r.Context().Value(ContextKey(name))
	return v, v != nil
}
