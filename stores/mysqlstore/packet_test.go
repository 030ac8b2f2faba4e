package mysqlstore

import (
	"bytes"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/internal/testservers"
	"github.com/reqlock/reqlock/stores"
)

// TestMaxRecordBytesFromServer (issue 23): on a MariaDB started with
// max_allowed_packet 1 MiB, the Store states, once started, the largest
// record whose FinishRecord statement fits it (not a constant that assumes
// 4 MB), and keeps a record of that size whose every byte the driver
// escapes (NUL, quote, backslash), prepared and interpolated alike, byte
// for byte; one byte more is refused with stores.ErrInvalid before any
// statement. Bounds read before the Store started (4 MiB assumed) are
// lowered to the server's when it starts.
func TestMaxRecordBytesFromServer(t *testing.T) {
	const packet = 1 << 20
	_, dsn := testservers.MySQLServer(t, "--max-allowed-packet=1M")
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	open := func(interpolate bool) *sql.DB {
		cfg := cfg.Clone()
		cfg.InterpolateParams = interpolate
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	var got int
	if err := open(false).QueryRowContext(t.Context(), "SELECT @@SESSION.max_allowed_packet").Scan(&got); err != nil || got != packet {
		t.Fatalf("the server's max_allowed_packet: %d, %v; want %d", got, err, packet)
	}
	early := newStore(t, open(false))
	if b := early.Bounds(); b.MaxRecordBytes != recordBytes(assumedPacket) {
		t.Fatalf("Bounds before the Store started: MaxRecordBytes %d, want %d (4 MiB assumed)", b.MaxRecordBytes, recordBytes(assumedPacket))
	}
	if err := early.Release(t.Context(), []string{"start"}, "t", 0); !errors.Is(err, stores.ErrNotHeld) {
		t.Fatalf("the first call: %v", err)
	}
	if b := early.Bounds(); b.MaxRecordBytes != recordBytes(packet) {
		t.Fatalf("Bounds stated before the Store started, once it started on a server of max_allowed_packet %d: MaxRecordBytes %d, want %d",
			packet, b.MaxRecordBytes, recordBytes(packet))
	}
	for _, c := range []struct {
		name        string
		interpolate bool
		unprepared  bool
	}{{"prepared", false, false}, {"interpolated", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, open(c.interpolate))
			if c.unprepared {
				s.stmts.close() // every statement runs unprepared: the driver interpolates its arguments
			}
			ctx := t.Context()
			if err := s.Release(ctx, []string{"start"}, "t", 0); !errors.Is(err, stores.ErrNotHeld) {
				t.Fatalf("the first call: %v", err)
			}
			limit := s.Bounds().MaxRecordBytes
			if limit <= 0 || limit > packet/2 || limit < packet/2-16<<10 {
				t.Fatalf("MaxRecordBytes on a server of max_allowed_packet %d: %d, want just under half of it", packet, limit)
			}
			if !strings.Contains(s.Bounds().Reason, "1048576") {
				t.Errorf("Bounds().Reason = %q, want the server's max_allowed_packet", s.Bounds().Reason)
			}
			fp := strings.Repeat("\x00'", 100)
			body := bytes.Repeat([]byte("\\\x00'\"\n\r\x1a"), limit)[:limit-len(fp)]
			rec := stores.Record{Fingerprint: fp, Response: body, Fence: 7}
			k := strings.Repeat("\x00'\\", 170) // a long key, escaped too
			g, _, err := s.ClaimRecord(ctx, k, "a", time.Minute)
			if err != nil || !g.OK {
				t.Fatalf("claim: %+v, %v", g, err)
			}
			big := rec
			big.Response = append(bytes.Clone(body), 0)
			if err := s.FinishRecord(ctx, k, "a", big, time.Minute); !errors.Is(err, stores.ErrInvalid) {
				t.Fatalf("FinishRecord of MaxRecordBytes+1 (%d bytes): %v, want ErrInvalid", big.Size(), err)
			}
			if err := s.FinishRecord(ctx, k, "a", rec, time.Minute); err != nil {
				t.Fatalf("FinishRecord of MaxRecordBytes (%d bytes, every byte escaped): %v", rec.Size(), err)
			}
			_, back, err := s.ClaimRecord(ctx, k, "b", time.Minute)
			if err != nil || back == nil || back.Fingerprint != fp || !bytes.Equal(back.Response, body) || back.Fence != 7 {
				t.Fatalf("replay of the record of MaxRecordBytes: %v, %v; want it byte for byte", back != nil, err)
			}
			if err := s.Release(ctx, []string{k}, "a", 0); !errors.Is(err, stores.ErrNotHeld) {
				t.Fatalf("Release of the finished claim: %v, want ErrNotHeld", err)
			}
			_, _ = s.db.ExecContext(ctx, "DELETE FROM "+quoteTable(s.table)+" WHERE lock_key = ?", k)
		})
	}
}
