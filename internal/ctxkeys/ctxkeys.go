// Package ctxkeys names the context values that reqlock's packages share
// without exporting them.
package ctxkeys

// RequestContext is the string key under which a router's own context type
// that is a context.Context but does not reach the request's context (gin's
// *gin.Context, whose Value consults only its Keys for string keys unless
// the engine enables ContextWithFallback) holds the request's context. The
// lock core looks a context up there when the context itself carries no
// lock, so that Obtain(c, ...) and FromContext(c) with gin's c behave as
// with c.Request.Context().
const RequestContext = "github.com/reqlock/reqlock.requestContext"
