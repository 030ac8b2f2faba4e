package filestore

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/crc32"
)

// The record that makes up every key file: the key's last fence, and the
// expiry and process of its latest grant. Stores read it through a shared
// mapping (see mapKeyFile) and write it with pwrite(2), which reports a
// full disk as an error (a write through the mapping would raise SIGBUS
// instead, on file systems that allocate on write). Only a process holding
// the file's flock writes it. The fence
// is what a grant reads back (under the flock); the expiry and pid are hints
// for the processes a grant refuses, which read the record without the
// flock and rely on the checksum to skip one caught mid-write.
//
// Layout, little-endian:
//
//	 0  magic "RQLK"
//	 4  version (1)
//	 5  mode: 0 while an exclusive grant holds the file's flock (versions
//	    without shared grants write 0 here, and leave it when they let
//	    go), 1 when the latest grant was a shared one, 2 when the latest
//	    exclusive grant has ended: its end writes 2 before it lets go of
//	    the flock, and a call that takes the flock and finds 0 (a grant
//	    whose process died) writes 2 too. Other Stores read it to tell an
//	    exclusive grant from a call that holds the flock for a moment
//	 6  2 bytes reserved (0)
//	 8  fence, int64: the last fence issued for the key
//	16  expiry, int64: Unix nanoseconds (wall clock) at which the latest
//	    grant ends, unless refreshed
//	24  pid, uint32: the process that made the latest grant
//	28  CRC-32C of bytes 0-27
//
// A record of zeros (a new file), or one with a bad magic or checksum (torn
// by a crash of the host), reads as fence 0.
//
// After the record, at recordSize, comes the waiter mark: the last refusal
// of the key by a grant of another Store (another process, mostly), which
// the refused Store writes (pwrite) without the flock, and the holder reads
// when it lets go (see Store.ReleaseWaited). Refused Stores may write it at
// once; one of them wins, and a torn mark fails its checksum and reads as
// none: a holder misses that refusal, and the waiter's next one marks again.
//
//	32  store, uint64: the refused Store's random id, never 0
//	40  at, int64: Unix nanoseconds (wall clock) of the refusal
//	48  CRC-32C of bytes 32-47
//
// Then the header of the shared table (see shared.go), which only the
// holder of the file's flock writes, with the table, in one pwrite:
//
//	52  holders, uint16: the holders in the table
//	54  writers, uint16: the waiting writers' records in the table
//	56  until, int64: Unix nanoseconds of the latest holder's expiry
//
// Versions without shared grants leave bytes 52-63 zero: no table, which is
// how their files read. The table follows at fileSize, holders then
// writers, each tableEntrySize bytes, and a CRC-32C of them all:
//
//	 0  token, 16 bytes: the first 16 bytes of the token's SHA-256
//	16  expiry, int64: Unix nanoseconds at which the place (or record) ends
//	24  granted, int64: Unix nanoseconds of the grant (or first refusal)
//
// The header and the table are written in one pwrite, which the kernel
// copies in order, page by page: a process killed in the middle (SIGKILL)
// leaves the header and a first part of the table new, and the rest as it
// was, and a crash of the host may lose any part of it. A table of up to
// 125 entries lies in the file's first page with the header, and a pwrite
// within one page is whole or not at all. A table whose checksum fails, or
// that is short, reads as the header tells: that many holders, of tokens
// it no longer knows, each until the header's until (the latest expiry
// among them), and no writers' records. So a torn table forgets no holder
// for a limit or an exclusive grant; its holders' ReleaseShared and
// RefreshShared answer ErrNotHeld, and their places last until until, at
// most the longest TTL among them; the writers lose their precedence.
//
// Files made by versions without the mark are 32 bytes long; the first
// Store that maps such a file extends it to fileSize, which changes nothing
// for a Store that maps the first 32 bytes only.
const (
	recordMagic    = "RQLK"
	recordVersion  = 1
	recordSize     = 32
	markSize       = 20
	headerOffset   = recordSize + markSize
	fileSize       = 64
	tableEntrySize = 32
)

// The modes of a record: whether an exclusive grant holds the key file's
// flock, else the kind of the key's latest grant.
const (
	modeExclusive = 0
	modeShared    = 1
	modeFree      = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is a key file's record, decoded.
type record struct {
	fence  int64
	expiry int64 // Unix nanoseconds
	pid    uint32
	mode   byte // modeExclusive, modeShared or modeFree
}

// readRecord reads the record in mem, a key file's mapping; ok is false for
// a record that is new or torn. It copies the record first, so that a
// record another process is writing cannot pass the checksum and change
// after.
func readRecord(mem []byte) (r record, ok bool) {
	var buf [recordSize]byte
	copy(buf[:], mem)
	return decodeRecord(buf[:])
}

// decodeRecord decodes buf, a key file's record; ok is false for a record
// that is new or torn.
func decodeRecord(buf []byte) (r record, ok bool) {
	if len(buf) < recordSize || string(buf[:4]) != recordMagic || buf[4] != recordVersion {
		return record{}, false
	}
	if crc32.Checksum(buf[:28], castagnoli) != binary.LittleEndian.Uint32(buf[28:32]) {
		return record{}, false
	}
	return record{
		fence:  int64(binary.LittleEndian.Uint64(buf[8:16])),
		expiry: int64(binary.LittleEndian.Uint64(buf[16:24])),
		pid:    binary.LittleEndian.Uint32(buf[24:28]),
		mode:   buf[5],
	}, true
}

// encode writes r into buf, of recordSize bytes.
func (r record) encode(buf []byte) {
	copy(buf[:4], recordMagic)
	buf[4] = recordVersion
	buf[5], buf[6], buf[7] = r.mode, 0, 0
	binary.LittleEndian.PutUint64(buf[8:16], uint64(r.fence))
	binary.LittleEndian.PutUint64(buf[16:24], uint64(r.expiry))
	binary.LittleEndian.PutUint32(buf[24:28], r.pid)
	binary.LittleEndian.PutUint32(buf[28:32], crc32.Checksum(buf[:28], castagnoli))
}

// mark is a key file's waiter mark, decoded.
type mark struct {
	store uint64 // the refused Store's id
	at    int64  // Unix nanoseconds
}

// readMark reads the waiter mark in mem, a key file's mapping; ok is false
// when there is none, or it is torn.
func readMark(mem []byte) (m mark, ok bool) {
	if len(mem) < recordSize+markSize {
		return mark{}, false
	}
	var buf [markSize]byte
	copy(buf[:], mem[recordSize:])
	if crc32.Checksum(buf[:16], castagnoli) != binary.LittleEndian.Uint32(buf[16:20]) {
		return mark{}, false
	}
	m = mark{store: binary.LittleEndian.Uint64(buf[0:8]), at: int64(binary.LittleEndian.Uint64(buf[8:16]))}
	return m, m.store != 0
}

// encode writes m into buf, of markSize bytes.
func (m mark) encode(buf []byte) {
	binary.LittleEndian.PutUint64(buf[0:8], m.store)
	binary.LittleEndian.PutUint64(buf[8:16], uint64(m.at))
	binary.LittleEndian.PutUint32(buf[16:20], crc32.Checksum(buf[:16], castagnoli))
}

// header is the header of a key file's shared table, decoded.
type header struct {
	holders, writers uint16
	until            int64 // Unix nanoseconds of the latest holder's expiry
}

// readHeader reads the shared table's header in mem, a key file's mapping.
// Under the file's flock it is exact; without, a hint.
func readHeader(mem []byte) header {
	var buf [fileSize - headerOffset]byte
	copy(buf[:], mem[headerOffset:])
	return header{
		holders: binary.LittleEndian.Uint16(buf[0:2]),
		writers: binary.LittleEndian.Uint16(buf[2:4]),
		until:   int64(binary.LittleEndian.Uint64(buf[4:12])),
	}
}

// liveHolders reports whether the header tells of a holder unexpired at
// now (Unix nanoseconds).
func (h header) liveHolders(now int64) bool { return h.holders > 0 && h.until > now }

// place is an entry of the shared table: a holder's place, or a waiting
// writer's record.
type place struct {
	token   [16]byte // tokenID of the token
	expiry  int64    // Unix nanoseconds
	granted int64    // Unix nanoseconds
}

// table is a key file's shared table, decoded.
type table struct {
	holders, writers []place
}

// tokenID returns the identity of token in the shared table.
func tokenID(token string) (id [16]byte) {
	sum := sha256.Sum256([]byte(token))
	copy(id[:], sum[:])
	return id
}

// decodeTable decodes buf, the table after the file's first fileSize
// bytes, as h describes it; a torn or short table reads as h.holders
// holders of unknown tokens until h.until (see the layout above).
func decodeTable(h header, buf []byte) table {
	n := int(h.holders) + int(h.writers)
	if n == 0 {
		return table{}
	}
	if len(buf) < n*tableEntrySize+4 || crc32.Checksum(buf[:n*tableEntrySize], castagnoli) != binary.LittleEndian.Uint32(buf[n*tableEntrySize:]) {
		return tornTable(h)
	}
	body := buf[:n*tableEntrySize]
	ps := make([]place, n)
	for i := range ps {
		b := body[i*tableEntrySize:]
		copy(ps[i].token[:], b[:16])
		ps[i].expiry = int64(binary.LittleEndian.Uint64(b[16:24]))
		ps[i].granted = int64(binary.LittleEndian.Uint64(b[24:32]))
	}
	return table{holders: ps[:h.holders:h.holders], writers: ps[h.holders:]}
}

// tornTable is the table that a torn table with header h reads as:
// h.holders places of no token (no tokenID is zero but by a 2⁻¹²⁸ chance),
// each until h.until, granted at the earliest time (so their expiry
// signals every marked waiter), and no writers.
func tornTable(h header) table {
	ps := make([]place, h.holders)
	for i := range ps {
		ps[i] = place{expiry: h.until, granted: 1}
	}
	return table{holders: ps}
}

// encode returns t's header and the bytes to write at headerOffset: the
// header, its padding up to fileSize, and the table with its checksum.
func (t table) encode() (header, []byte) {
	h := header{holders: uint16(len(t.holders)), writers: uint16(len(t.writers))}
	for _, p := range t.holders {
		h.until = max(h.until, p.expiry)
	}
	n := len(t.holders) + len(t.writers)
	buf := make([]byte, fileSize-headerOffset+n*tableEntrySize+4)
	binary.LittleEndian.PutUint16(buf[0:2], h.holders)
	binary.LittleEndian.PutUint16(buf[2:4], h.writers)
	binary.LittleEndian.PutUint64(buf[4:12], uint64(h.until))
	body := buf[fileSize-headerOffset:]
	for i, p := range append(append([]place(nil), t.holders...), t.writers...) {
		b := body[i*tableEntrySize:]
		copy(b[:16], p.token[:])
		binary.LittleEndian.PutUint64(b[16:24], uint64(p.expiry))
		binary.LittleEndian.PutUint64(b[24:32], uint64(p.granted))
	}
	binary.LittleEndian.PutUint32(body[n*tableEntrySize:], crc32.Checksum(body[:n*tableEntrySize], castagnoli))
	return h, buf
}
