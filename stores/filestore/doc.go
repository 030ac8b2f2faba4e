// Package filestore is a stores.Store for the processes of one host: a lock
// is an exclusive flock(2) on a file per key in a directory they share, as
// the PHP services of reqlock's source documents use flock(LOCK_EX|LOCK_NB).
// Use it for several worker processes on one machine without a lock server;
// processes of other hosts do not see its locks. Shared and limited grants
// are listed in the key file instead (see Shared and limited grants).
//
//	store, err := filestore.New("/run/myapp/locks") // or Open(ctx, "file:///run/myapp/locks")
//
// # How a lock is held
//
// Acquire takes the flock of each key's file (in key order; see the file
// names below) without waiting; when one is held, it drops what it took and
// refuses, all or nothing. A grant keeps its flocks, on files the Store
// keeps open, for the whole hold: Release (keep zero) drops them, which
// frees the keys for every process at once, and so does the end of the
// process, by any signal (SIGKILL included), since the kernel closes its
// files. Locks are per open file description, so two Stores of one process
// exclude each other as two processes do; within one Store, a key it holds
// refuses other tokens without a system call, and its own token (a retried
// Acquire) is granted again with a fresh fence.
//
// A Store keeps the files of keys it no longer holds open, up to 1024 of
// them (the least recently used are closed beyond that), with their record
// mapped into memory for reading, so an uncontended grant and its release
// cost four system calls: flock(LOCK_EX|LOCK_NB), pwrite of the fence,
// pwrite of the record's mark that the grant ended (see Shared and limited
// grants), and flock(LOCK_UN).
//
// The TTL is enforced by the holding process: a timer ends a grant that was
// neither released nor refreshed in time, closing its files. A flock cannot
// be taken from another process, so a hold ends only in the process that
// made it: by Release, its TTL (its timer), Close, or the end of the
// process. A process that is stopped (SIGSTOP, a debugger) keeps its keys
// past their TTL until it runs again or dies. Refresh and Release act only
// on grants of the same Store, which are the only ones a Locker's token can
// name.
//
// # Fences
//
// Each key file is 64 bytes: a 32-byte record (see record.go) that holds
// the key's last fence, a waiter mark (see Hot keys below) and the header
// of the shared table, which follows (see Shared and limited grants). Acquire
// reads the fence and writes the next one back while it holds the flock,
// so fences grow by at least stores.FenceStride from grant to grant of a
// key, whatever process makes them, across release, expiry and the
// restart of any process (the page cache outlives processes). Files
// are not fsynced. A crash of the host may lose the last fences written, so
// every fence is also at least the wall clock in microseconds: after a
// reboot fences still grow, unless the clock stepped back or the key was
// granted more than about 976 times a second (10⁶/FenceStride) for long
// enough before the crash that its fences ran ahead of the clock by more
// than they lost. A key's file is never removed (its fence lives there): the
// directory holds one small file per key ever locked.
//
// Leave the files alone while processes use the directory: a key file
// removed or replaced while a process has it open splits the key in two
// (that process locks the old file, others a new one), and a key file
// truncated while mapped crashes the processes that map it (SIGBUS).
//
// The record also holds the grant's expiry (wall clock) and process, as a
// hint: a refusal by another process's grant reads its remaining TTL there
// for Grant.Wait, or zero when the record does not tell.
//
// # Shared and limited grants
//
// Store implements stores.SharedStore. A key's holders and its waiting
// writers' records live in the key file, in a table after the record (see
// record.go), each with its own expiry (wall clock) and a 16-byte hash of
// its token. AcquireShared, ReleaseShared and RefreshShared take the file's
// exclusive flock for a moment (flock, pread of the table, pwrite, flock
// again to let go), read the table, change it and write it back: one
// atomic read-modify-write for every process. No flock is kept for a
// holder, so that holders of any number of processes share the key and a
// limit counts them all: a holder's place lasts until its expiry or its
// release, whatever becomes of its process. A process that dies or stops
// (SIGSTOP) holding a place keeps it until its TTL, no longer (unlike an
// exclusive grant, which the kernel frees at the death of its process, and
// a stopped process keeps past its TTL). Close does not end the Store's
// shared places: they expire.
//
// An exclusive grant keeps its flock for the whole hold, as ever, and is
// made only while the table has no unexpired holder. Acquire reads the
// table's header in its mapping once it has the flock: a key that never had
// a holder (or whose header says none is left) costs it no system call
// more. A key with holders refuses it and records its token as a waiting
// writer (Grant.SharedHeld), which keeps new holders out for
// stores.WriterWindow; the token's exclusive grant or its Release (answered
// ErrNotHeld) ends the record. A Release that finds the flock held by
// another Store's exclusive grant leaves the record to lapse.
//
// Shared and exclusive grants draw their fences from the record's one
// sequence (see Fences). The record also tells other Stores whether an
// exclusive grant holds the flock: a grant writes so as soon as it has the
// flocks of its keys, and its end writes the opposite before it lets go.
// A call that finds the flock held reads it: held by an exclusive grant
// (and no holder unexpired), it is refused at once (ReleaseShared and
// RefreshShared answer ErrNotHeld); held otherwise, for a moment, by
// another Store's call (a shared call, or an exclusive Acquire before its
// grant or refused), it waits for the flock, polling (every 20µs, doubling
// up to 1ms), as long as its context lasts, and returns an error wrapping
// ctx.Err() when it ends. So a refusal always names an exclusive grant, a
// holder, a limit or a writer, never a busy file, and the release of a
// holder (whose place no exclusive grant coexists with) never fails because
// another Store is slow. A process stopped (SIGSTOP) in the middle of such a
// call holds up the key's callers until their contexts end. The one
// exception: an exclusive grant whose process died (SIGKILL) leaves its
// record telling of it, until the first call to take the flock after
// corrects it (one pwrite): a call that finds the flock held by that call
// in between is refused as by an exclusive grant, with a Wait of that
// grant's remaining TTL.
//
// A table written in part (its process killed in the middle of its
// pwrite, possible for a table beyond the file's first page, over 125
// holders and writers' records; or a crash of the host) fails its checksum
// and reads as the header written with it tells: that many holders, until
// the latest expiry among them, of tokens forgotten, so a limit still
// counts them and an exclusive grant still waits for them; their
// ReleaseShared and RefreshShared answer ErrNotHeld, and the waiting
// writers' records are lost (see record.go).
//
// ReleaseShared, and any call that finds holders expired, signal the key's
// waiters: this Store's subscribers, and, on Linux, other processes' by
// ringing the file (see Release notification) when a refused caller
// marked it since the freed place was granted: of any Store, the
// releasing one included, whose own refusal may have overwritten another
// Store's mark (the mark is one slot). Refused shared callers mark the
// file as refused exclusive ones do.
//
// Key files of versions without shared grants read as keys without
// holders: the table's header takes bytes that those versions leave zero,
// and the record keeps its version and layout (the shared mode is a byte
// they left reserved), so they read the fences this version writes. They
// do not read the table, though: a process of such a version would grant a
// key exclusively over holders. Every process that takes shared or limited
// grants on a directory must run this version or later, and so must every
// process that locks those keys.
//
// # Limits
//
// Keys of any length (a long key's file is named by its SHA-256), and TTLs
// (and keeps) from 1ns up to 100 years: the record holds the expiry in
// int64 Unix nanoseconds, which end in 2262. Store.Bounds says so, and the
// Store refuses a longer TTL with an error wrapping stores.ErrInvalid
// before it acts. A very long key costs its length in memory while the
// Store keeps its file open, and nothing on disk.
//
// # File names
//
// A key is escaped into a file name of the bytes a-z, 0-9, '-', '.' and '_'
// (see names.go), injectively and without path separators, so no key
// reaches outside the directory and distinct keys never share a file; a key
// whose escaped form exceeds 200 bytes is named by its SHA-256.
//
// # Where it refuses to run
//
// New (and Open) refuse a relative directory, and a directory where flock
// cannot lock across this host's processes: on Linux, network and cluster
// file systems (NFS, SMB/CIFS, 9P, AFS, Ceph, Lustre, GFS2, OCFS2) and FUSE,
// by statfs(2); and, on every platform, a directory where a probe (a second
// open file description of a locked file must be refused the lock) shows
// that flock does not exclude. The package builds on Linux, macOS and the
// BSDs.
//
// # Release notification
//
// Store implements stores.Notifier: its own releases and expiries signal
// its waiters at once, in order. Releases by other processes (or other
// Stores) reach a waiter through the file system, on Linux: an Acquire
// refused by another Store's grant writes a waiter mark into the key file
// (one pwrite, on the contended path only), and the holder's Store, when
// the grant ends, sees the mark in its mapping (no system call) and rings
// the file: it sets the file's times to now (utimensat), an inotify(7)
// IN_ATTRIB event. Each Store has one inotify instance, made at its first
// subscription, with a watch on the file of each key its waiters wait for;
// its reader signals their subscribers. A release that refused nobody
// rings nothing, so the uncontended path costs no more. The kernel bounds
// inotify instances and watches per user (fs.inotify.max_user_instances,
// often 128, and max_user_watches): a Store that cannot have one, or a
// file that cannot be watched, goes without, and its waiters poll. On
// macOS and the BSDs nothing rings: waiters of other processes poll, at
// the Locker's hot-key poll (see reqlock.WithBackoff), which the holders,
// told of them by the mark, hold back for.
//
// # Hot keys
//
// Store implements stores.WaitReporter with the same mark: its release
// tells the Locker whether a waiter of another Store was refused during the
// grant, and the Locker of a process that passes a hot key among its own
// requests then holds back long enough for that waiter to take it (see
// reqlock.WithHandoff). Two processes on one hot key take turns of about
// 50ms. Measured with TestHotKeySharedByTwoProcesses (two processes, 4
// requests each, 1ms of work, 3s; 5 runs alternated with the store and
// Locker before):
//
//	                          before           now
//	smaller share (median)    28% (0-37%)      49% (49-50%)
//	longest without a grant   0.9-3.0s         25-83ms
//
// and with the root package's BenchmarkHotKey (two Stores of one process):
// with 1ms of work the key serves 819 grants/s (777 before, when one
// process starved), with none 43k (27k); one process alone, 795 and 14.9k
// (782 and 14.7k).
//
// # Context
//
// Every call does its work in a few non-blocking system calls on local
// files (flock with LOCK_NB or LOCK_UN, pwrite; for a key whose file is not
// open, open, fstat, ftruncate and mmap) and checks its context before it
// starts. Between them, a call that finds a key file's flock held for a
// moment by another Store's call polls for it until its context ends (see
// Shared and limited grants). It does not watch the context during a
// system call: a file system that hangs one holds the call up with it.
//
// # Start-up
//
// There is no server: Open and New fail when the directory cannot be
// created or used, whatever the URL's connect parameter (check or lazy)
// says.
//
// # No idempotency records
//
// The Store does not implement stores.RecordStore (yet): a record file
// beside the lock file fits the locking, but its removal once expired needs
// a sweep of the directory of its own, which the Store does not have (a
// lock file is taken over, not removed, by the next grant).
package filestore
