package pgstore

import (
	"fmt"

	"github.com/reqlock/reqlock/stores"
)

// defaultBlockSize is PostgreSQL's default page size, which Bounds assumes
// until the Store has read the server's.
const defaultBlockSize = 8192

// setBounds sets Bounds for pages of blockSize bytes.
func (s *Store) setBounds(blockSize int) {
	s.bounds.Store(&stores.Bounds{
		MaxKeyBytes:    maxKeyBytes(blockSize),
		MaxRecordBytes: MaxRecordBytes,
		Reason: fmt.Sprintf("PostgreSQL's btree entry limit for pgstore's primary key on the key (a third of a %d-byte page); "+
			"records: pgstore.MaxRecordBytes, half of PostgreSQL's 1 GB limit on a field and on a message", blockSize),
	})
}

// Bounds returns the keys and durations the Store honours: keys up to the
// longest a btree entry of the table's primary key holds (2692 bytes with
// PostgreSQL's 8 kB pages; longer keys that compress below it would fit,
// but a random one does not), and every duration from 1ns, rounded up to
// the server clock's microsecond, to math.MaxInt64: 292 years, far within
// timestamptz (to the year 294276) and an interval's 64-bit microseconds;
// records up to MaxRecordBytes, kept for any such duration. It implements
// stores.Bounded.
func (s *Store) Bounds() stores.Bounds { return *s.bounds.Load() }

// maxKeyBytes returns the length of the longest key that the table's
// primary key indexes on a server whose pages are blockSize bytes, whatever
// its bytes (an incompressible key). A btree entry (version 4, PostgreSQL
// 12 and later; version 3 allows 8 bytes more) holds at most a third of
// what a page leaves after its headers, less a heap pointer, each rounded
// to the 8-byte alignment; the entry of a key is an 8-byte tuple header, a
// 4-byte bytea header and the key, rounded up to the alignment. With 8 kB
// pages: 2704 bytes an entry, 2692 a key.
func maxKeyBytes(blockSize int) int {
	const (
		align            = 8
		pageHeader       = 24 // SizeOfPageHeaderData
		itemID           = 4  // ItemIdData: a page holds at least 3 entries
		btreeSpecial     = 16 // BTPageOpaqueData
		heapPointer      = 6  // ItemPointerData
		indexTupleHeader = 8  // IndexTupleData
		varlenaHeader    = 4  // a bytea over 126 bytes
	)
	up := func(n int) int { return (n + align - 1) &^ (align - 1) }
	down := func(n int) int { return n &^ (align - 1) }
	entry := down((blockSize-up(pageHeader+3*itemID)-up(btreeSpecial))/3) - up(heapPointer)
	return entry - indexTupleHeader - varlenaHeader
}
