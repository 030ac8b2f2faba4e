package middleware

// Must returns v, and panics when err is not nil: wrap a constructor with it
// at start-up, where a bad configuration should stop the program, never on a
// request path.
//
//	guard := middleware.Must(middleware.New(locker, "sku:<id>"))
//	rt := middleware.Must(middleware.LoadRoutes(locker, "routes.yaml"))
//	handler := middleware.Must(rt.Handler(mux))
func Must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
