// Package bench compares reqlock over redlockstore with
// github.com/go-redsync/redsync/v4 on the same 5 Redis nodes. It is a module
// of its own so that redsync, needed only here, stays out of the core
// module's go.mod. Run it with:
//
//	cd stores/redlockstore/bench && go test -run '^$' -bench . -benchtime 2s
package bench
