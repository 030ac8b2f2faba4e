// Package bench compares reqlock over filestore with github.com/gofrs/flock,
// the common Go flock wrapper, in one run. It is a module of its own so that
// the core module does not inherit gofrs/flock. Run it with
//
//	cd stores/filestore/bench && go test -run '^$' -bench . -count 3
package bench
