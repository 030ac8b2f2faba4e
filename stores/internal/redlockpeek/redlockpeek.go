// Package redlockpeek lets the shared Redlock tests (stores/internal/redlocktest),
// which run on every client in every module that has one, read what a
// redlockstore.Store keeps to itself. Package redlockstore sets the
// functions; each takes a *redlockstore.Store.
package redlockpeek

var (
	// Gate returns the node the acquisitions of key try first.
	Gate func(store any, key string) int
	// NotifyNode returns the node that carries key's release signals.
	NotifyNode func(store any, key string) int
	// TokenStates returns how many tokens the Store keeps a state for.
	TokenStates func(store any) int
)
