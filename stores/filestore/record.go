package filestore

import (
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
//	 4  version (1), then 3 bytes reserved (0)
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
//	52  reserved (0) up to fileSize
//
// Files made by versions without the mark are 32 bytes long; the first
// Store that maps such a file extends it to fileSize, which changes nothing
// for a Store that maps the first 32 bytes only.
const (
	recordMagic   = "RQLK"
	recordVersion = 1
	recordSize    = 32
	markSize      = 20
	fileSize      = 64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is a key file's record, decoded.
type record struct {
	fence  int64
	expiry int64 // Unix nanoseconds
	pid    uint32
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
	}, true
}

// encode writes r into buf, of recordSize bytes.
func (r record) encode(buf []byte) {
	copy(buf[:4], recordMagic)
	buf[4] = recordVersion
	buf[5], buf[6], buf[7] = 0, 0, 0
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
