//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package filestore

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/reqlock/reqlock/stores"
)

var (
	_ stores.Store        = (*Store)(nil)
	_ stores.Notifier     = (*Store)(nil)
	_ stores.WaitReporter = (*Store)(nil)
	_ stores.SharedStore  = (*Store)(nil)
)

// Store is the file store; on this platform, which lacks flock(2), New
// always fails and no Store exists.
type Store struct{}

// errPlatform is the error of New and Open on this platform.
var errPlatform = fmt.Errorf("%w: %w: %s has no flock(2); the file store runs on Linux, macOS and the BSDs",
	stores.ErrInvalid, ErrUnsupported, runtime.GOOS)

// New fails on this platform with an error wrapping stores.ErrInvalid and
// ErrUnsupported.
func New(string) (*Store, error) { return nil, errPlatform }

// Open fails on this platform as New does.
func Open(context.Context, string) (*Store, error) { return nil, errPlatform }

// Dir returns "": no Store exists on this platform.
func (*Store) Dir() string { return "" }

// Close returns nil: no Store exists on this platform.
func (*Store) Close() error { return nil }

// Acquire returns ErrClosed: no Store exists on this platform.
func (*Store) Acquire(context.Context, []string, string, time.Duration) (stores.Grant, error) {
	return stores.Grant{}, ErrClosed
}

// Release returns ErrClosed: no Store exists on this platform.
func (*Store) Release(context.Context, []string, string, time.Duration) error { return ErrClosed }

// ReleaseWaited returns ErrClosed: no Store exists on this platform.
func (*Store) ReleaseWaited(context.Context, []string, string, time.Duration) (bool, error) {
	return false, ErrClosed
}

// Refresh returns ErrClosed: no Store exists on this platform.
func (*Store) Refresh(context.Context, []string, string, time.Duration) error { return ErrClosed }

// NotifyRelease returns a nil channel: no Store exists on this platform.
func (*Store) NotifyRelease(string, string) (<-chan struct{}, func()) { return nil, func() {} }

// AcquireShared returns ErrClosed: no Store exists on this platform.
func (*Store) AcquireShared(context.Context, string, string, int, time.Duration) (stores.Grant, error) {
	return stores.Grant{}, ErrClosed
}

// ReleaseShared returns ErrClosed: no Store exists on this platform.
func (*Store) ReleaseShared(context.Context, string, string, time.Duration) error { return ErrClosed }

// RefreshShared returns ErrClosed: no Store exists on this platform.
func (*Store) RefreshShared(context.Context, string, string, time.Duration) error { return ErrClosed }
