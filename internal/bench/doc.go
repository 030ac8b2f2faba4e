// Package bench holds the request-path benchmarks of every adapter, each
// beside an unlocked baseline served by the same router in the same run, and
// the test that counts Redis round trips per locked request.
//
//	./scripts/bench.sh        # or: go test -run '^$' -bench . -benchmem ./internal/bench
package bench
