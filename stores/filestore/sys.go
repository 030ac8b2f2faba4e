//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package filestore

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"syscall"
)

// openKeyFile opens (creating it when missing) a key file for reading and
// writing, closed on exec so that no child process inherits its flock.
func openKeyFile(path string, perm uint32) (int, error) {
	for {
		fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, perm)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

// mapKeyFile opens a key file and maps its record and waiter mark into
// memory, shared with every process that maps, reads or writes it: reading
// them then costs no system call. A new (or older, shorter) file is
// extended to fileSize first, which is safe without the flock: extending a
// file to the size it already has changes nothing.
func mapKeyFile(path string, perm uint32) (fd int, mem []byte, err error) {
	fd, err = openKeyFile(path, perm)
	if err != nil {
		return -1, nil, err
	}
	var st syscall.Stat_t
	if err = syscall.Fstat(fd, &st); err == nil && st.Size < fileSize {
		err = syscall.Ftruncate(fd, fileSize)
	}
	if err == nil {
		mem, err = syscall.Mmap(fd, 0, fileSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	}
	if err != nil {
		closeFile(fd)
		return -1, nil, err
	}
	return fd, mem, nil
}

// unmapKeyFile undoes mapKeyFile, which drops the file's flock.
func unmapKeyFile(fd int, mem []byte) {
	_ = syscall.Munmap(mem)
	closeFile(fd)
}

// tryLock takes fd's exclusive flock without waiting. held reports that
// another open file description (another process, another Store, another
// open of this process) holds it.
func tryLock(fd int) (held bool, err error) {
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return false, nil
		case err == syscall.EWOULDBLOCK:
			return true, nil
		case err != syscall.EINTR:
			return false, err
		}
	}
}

// unlockFile drops fd's flock.
func unlockFile(fd int) error {
	for {
		if err := syscall.Flock(fd, syscall.LOCK_UN); err != syscall.EINTR {
			return err
		}
	}
}

// writeRecord writes r into the key file fd.
func writeRecord(fd int, r record) error {
	var buf [recordSize]byte
	r.encode(buf[:])
	return pwriteAll(fd, buf[:], 0)
}

// writeMark writes m as the key file fd's waiter mark.
func writeMark(fd int, m mark) error {
	var buf [markSize]byte
	m.encode(buf[:])
	return pwriteAll(fd, buf[:], recordSize)
}

// writeTable writes the shared table's header and table, encoded by
// table.encode, into the key file fd.
func writeTable(fd int, b []byte) error { return pwriteAll(fd, b, headerOffset) }

// readTable reads the shared table that h, the file's header, describes
// from the key file fd.
func readTable(fd int, h header) (table, error) {
	n := int(h.holders) + int(h.writers)
	if n == 0 {
		return table{}, nil
	}
	buf := make([]byte, n*tableEntrySize+4)
	for off := 0; off < len(buf); {
		m, err := syscall.Pread(fd, buf[off:], int64(fileSize+off))
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return table{}, err
		case m == 0:
			return decodeTable(h, buf[:off]), nil // short: torn by a crash of the host
		}
		off += m
	}
	return decodeTable(h, buf), nil
}

// pwriteAll writes b into fd at off.
func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := syscall.Pwrite(fd, b, off)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return syscall.EIO
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// closeFile closes fd, which drops its flock.
func closeFile(fd int) { _ = syscall.Close(fd) }

// probeFlock checks that flock excludes in dir: with a fresh file locked
// through one open file description, a second one must be refused the
// lock. The kernel keeps flock locks per open file description, and treats
// two of one process as it treats those of two processes, so this shows
// that the locks bind the processes of this host. It catches a file system
// where flock succeeds without excluding (NFS mounted with local_lock=none
// on old kernels, FUSE file systems that ignore locks).
func probeFlock(dir string, perm uint32) error {
	var id [8]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	path := filepath.Join(dir, ".probe-"+hex.EncodeToString(id[:]))
	var fds [2]int
	for i := range fds {
		fd, err := openKeyFile(path, perm)
		if err != nil {
			for _, fd := range fds[:i] {
				closeFile(fd)
			}
			_ = syscall.Unlink(path)
			return fmt.Errorf("filestore: cannot create a file in %s: %w", dir, err)
		}
		fds[i] = fd
	}
	defer func() {
		_ = syscall.Unlink(path)
		closeFile(fds[0])
		closeFile(fds[1])
	}()
	switch held, err := tryLock(fds[0]); {
	case err != nil:
		return fmt.Errorf("%w: flock in %s: %w", ErrUnsupported, dir, err)
	case held:
		return fmt.Errorf("%w: flock in %s: a fresh file is locked already", ErrUnsupported, dir)
	}
	switch held, err := tryLock(fds[1]); {
	case err != nil:
		return fmt.Errorf("%w: flock probe in %s: %w", ErrUnsupported, dir, err)
	case !held:
		return fmt.Errorf("%w: flock does not exclude in %s: a second open file got the lock the first one holds", ErrUnsupported, dir)
	}
	return nil
}
