//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore_test

import (
	"testing"

	"github.com/reqlock/reqlock/stores"
	"github.com/reqlock/reqlock/stores/filestore"
	"github.com/reqlock/reqlock/stores/storetest"
)

// newStore returns a Store on a fresh temporary directory, closed when the
// test ends.
func newStore(t testing.TB, dir string) *filestore.Store {
	t.Helper()
	s, err := filestore.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Suite{
		New:    func(t *testing.T) stores.Store { return newStore(t, t.TempDir()) },
		Notify: true,
		// A refusal by another process's grant reads the holder's expiry
		// from the key file, which may not tell (see Store.Acquire).
		WaitUnknown: true,
		// Local files: no network to fail.
		InProcess: true,
	})
}
