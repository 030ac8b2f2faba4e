// Package bench compares reqlock over redlockstore with
// github.com/go-redsync/redsync/v4 on the same 5 Redis nodes. It is a module
// of its own so that redsync, needed only here, stays out of the core
// module's go.mod (and rueidis, which its reqlock-rueidis side uses, out of
// the core's). Run it with:
//
//	cd stores/redlockstore/bench && go test -run '^$' -bench . -benchtime 2s
//
// (-bench-rounds 3 runs every side three times, alternated.) The sides are
// reqlock over redlockstore on go-redis, reqlock-rueidis on rueidis nodes
// (rueidisstore.NewRedlock) and redsync.
package bench
