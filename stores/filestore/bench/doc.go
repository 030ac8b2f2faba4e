// Package bench compares reqlock over filestore with github.com/gofrs/flock,
// the common Go flock wrapper, in one run, alternating the two (-rounds).
// It is a module of its own so that the core module does not inherit
// gofrs/flock. Run it with
//
//	cd stores/filestore/bench && go test -run '^$' -bench . -benchtime 1s -rounds 3
//
// The lock files live in the test's temporary directory (its file system
// decides the cost of a system call). Hot is bound by its 1ms hold; spread
// and the 1000 cycles by the system calls and the Locker's own work.
package bench
