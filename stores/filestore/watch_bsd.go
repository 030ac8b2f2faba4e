//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

// watcher would watch key files for other processes' releases; on this
// platform there is none, and a Store's waiters poll for other processes'
// releases (see the package documentation).
type watcher struct{}

// newWatcher returns nil: this platform has no watcher.
func newWatcher(func(string)) *watcher { return nil }

func (*watcher) watch(string, string) {}
func (*watcher) unwatch(string)       {}
func (*watcher) close()               {}

// ring does nothing: no other process watches.
func ring(int) {}
