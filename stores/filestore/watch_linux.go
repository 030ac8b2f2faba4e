package filestore

import (
	"encoding/binary"
	"os"
	"sync"
	"syscall"
)

// watcher watches key files for other processes' releases, by inotify(7):
// a release of a grant that another Store's waiter marked rings the key
// file (see ring), and every Store that watches the file signals its
// subscribers of the key.
type watcher struct {
	fd     int      // the inotify instance
	file   *os.File // fd, for reads through the runtime's poller
	signal func(key string)
	done   chan struct{} // closed when the reader has returned

	mu     sync.Mutex
	closed bool
	byWD   map[int32]string
	byKey  map[string]int32
}

// newWatcher returns a watcher that calls signal with the key of each
// watched file that rings, or nil when inotify is not available (the
// processes' inotify instances ran out, say): the Store's waiters then
// poll for other processes' releases.
func newWatcher(signal func(key string)) *watcher {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	w := &watcher{
		fd:     fd,
		file:   os.NewFile(uintptr(fd), "inotify"), // non-blocking: reads park in the poller
		signal: signal,
		done:   make(chan struct{}),
		byWD:   make(map[int32]string),
		byKey:  make(map[string]int32),
	}
	go w.read()
	return w
}

// watch watches path, the file of key, for rings. A file that cannot be
// watched is left unwatched.
func (w *watcher) watch(key, path string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if _, ok := w.byKey[key]; ok {
		return
	}
	wd, err := syscall.InotifyAddWatch(w.fd, path, syscall.IN_ATTRIB)
	if err != nil {
		return
	}
	w.byWD[int32(wd)] = key
	w.byKey[key] = int32(wd)
}

// unwatch stops watching key's file.
func (w *watcher) unwatch(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wd, ok := w.byKey[key]
	if !ok || w.closed {
		return
	}
	delete(w.byKey, key)
	delete(w.byWD, wd)
	_, _ = syscall.InotifyRmWatch(w.fd, uint32(wd))
}

// read signals the key of each event until the watcher is closed. An
// overflowed event queue signals every watched key: a spurious signal costs
// an attempt, a lost one a poll.
func (w *watcher) read() {
	defer close(w.done)
	var buf [4096]byte
	var keys []string
	for {
		n, err := w.file.Read(buf[:])
		if err != nil {
			return // closed
		}
		keys = keys[:0]
		w.mu.Lock()
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			length := binary.NativeEndian.Uint32(buf[off+12:])
			off += syscall.SizeofInotifyEvent + int(length)
			switch {
			case mask&syscall.IN_Q_OVERFLOW != 0:
				for key := range w.byKey {
					keys = append(keys, key)
				}
			case mask&syscall.IN_ATTRIB != 0:
				if key, ok := w.byWD[wd]; ok {
					keys = append(keys, key)
				}
			}
		}
		w.mu.Unlock()
		for _, key := range keys {
			w.signal(key)
		}
	}
}

// close ends the watches and waits for the reader to return.
func (w *watcher) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	_ = w.file.Close()
	<-w.done
}

// ring tells the processes that watch the key file fd that its grant was
// released: it sets the file's times to now (utimensat on the descriptor,
// which needs write access only), an IN_ATTRIB event for their watches.
// Writing the record or the waiter mark (IN_MODIFY) rings nothing.
func ring(fd int) {
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_UTIMENSAT, uintptr(fd), 0, 0, 0, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}
