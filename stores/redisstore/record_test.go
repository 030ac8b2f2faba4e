package redisstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reqlock/reqlock/internal/testredis"
	"github.com/reqlock/reqlock/stores"
)

// TestRecordCommandCounts pins the commands of a record's path: a claim of
// a free key runs what an uncontended Acquire does, a finish three commands
// (four when a claimer waited), and a replay three.
func TestRecordCommandCounts(t *testing.T) {
	client := testredis.Client(t)
	s := newStore(t, client)
	ctx := context.Background()
	prefix := testredis.Prefix(t)
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if g, _, err := s.ClaimRecord(ctx, prefix+"warm-up", "t", time.Minute); err != nil || !g.OK {
		t.Fatalf("warm-up claim: %+v, %v", g, err)
	}
	m := newMonitor(t)
	marker := "marker-" + prefix
	k := prefix + "k"
	g, _, err := s.ClaimRecord(ctx, k, "t", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	rec := stores.Record{Fingerprint: "fp", Response: []byte("body"), Fence: g.Fences[0]}
	if err := s.FinishRecord(ctx, k, "t", rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, got, err := s.ClaimRecord(ctx, k, "u", time.Minute); err != nil || got == nil {
		t.Fatalf("replay: %+v, %v", got, err)
	}
	if err := client.Echo(ctx, marker).Err(); err != nil {
		t.Fatal(err)
	}
	calls := m.scripts(t, prefix, marker)
	want := [][]string{
		{"evalsha", "exists", "set", "time", "set"},
		{"evalsha", "get", "set", "del"},
		{"evalsha", "exists", "set", "get"},
	}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("claim, finish and replay ran %v, want %v", calls, want)
	}
}

// TestRecordBounds: the Store states its record limit, WithMaxRecordBytes
// sets it within range, and FinishRecord refuses a record over it before
// acting.
func TestRecordBounds(t *testing.T) {
	client := testredis.Client(t)
	if b := newStore(t, client).Bounds(); b.MaxRecordBytes != DefaultMaxRecordBytes || b.MaxKeyBytes != 0 || b.MaxTTL != 0 || b.MaxRetention != 0 {
		t.Fatalf("default Bounds %+v, want MaxRecordBytes %d and nothing else bounded", b, DefaultMaxRecordBytes)
	}
	for _, n := range []int{0, -1, MaxRecordBytesLimit + 1} {
		if _, err := New(client, WithMaxRecordBytes(n)); !errors.Is(err, stores.ErrInvalid) {
			t.Errorf("New with WithMaxRecordBytes(%d): %v, want ErrInvalid", n, err)
		}
	}
	s := newStore(t, client, WithMaxRecordBytes(16))
	if b := s.Bounds(); b.MaxRecordBytes != 16 || !strings.Contains(b.Reason, "WithMaxRecordBytes(16)") {
		t.Fatalf("Bounds %+v, want MaxRecordBytes 16 and a reason naming the option", b)
	}
	ctx := context.Background()
	k := testredis.Prefix(t) + "k"
	g, _, err := s.ClaimRecord(ctx, k, "t", time.Minute)
	if err != nil || !g.OK {
		t.Fatalf("claim: %+v, %v", g, err)
	}
	err = s.FinishRecord(ctx, k, "t", stores.Record{Fingerprint: "fp", Response: []byte("0123456789abcde")}, time.Minute)
	if !errors.Is(err, stores.ErrInvalid) || !strings.Contains(err.Error(), "WithMaxRecordBytes(16)") {
		t.Fatalf("FinishRecord of 17 bytes over a limit of 16: %v, want ErrInvalid naming the option", err)
	}
	if err := s.Refresh(ctx, []string{k}, "t", time.Minute); err != nil {
		t.Fatalf("the claim after a refused finish: %v", err)
	}
	rec := stores.Record{Fingerprint: "fp", Response: []byte("0123456789abcd"), Fence: g.Fences[0]}
	if err := s.FinishRecord(ctx, k, "t", rec, time.Minute); err != nil {
		t.Fatalf("FinishRecord of 16 bytes: %v", err)
	}
	if _, got, err := s.ClaimRecord(ctx, k, "u", time.Minute); err != nil || got == nil || string(got.Response) != "0123456789abcd" || got.Fence != rec.Fence {
		t.Fatalf("replay: %+v, %v", got, err)
	}
}

// TestRecordTokenLikeARecord: a token that starts like a record's value is
// refused, so that no claim reads as a record.
func TestRecordTokenLikeARecord(t *testing.T) {
	s := newStore(t, testredis.Client(t))
	k := testredis.Prefix(t) + "k"
	token := recordOwner("x")
	if _, _, err := s.ClaimRecord(context.Background(), k, token, time.Minute); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("ClaimRecord with a token %q: %v, want ErrInvalid", token, err)
	}
	if err := s.FinishRecord(context.Background(), k, token, stores.Record{}, time.Minute); !errors.Is(err, stores.ErrInvalid) {
		t.Fatalf("FinishRecord with a token %q: %v, want ErrInvalid", token, err)
	}
}

// TestRecordEncoding: decodeRecord reads what encodeRecord wrote, and
// refuses values it did not write.
func TestRecordEncoding(t *testing.T) {
	for _, rec := range []stores.Record{
		{},
		{Fingerprint: "a:b:1:", Response: []byte("12:x\x00"), Fence: -5},
		{Fingerprint: strings.Repeat("\xff", 300), Response: []byte(recordPrefix), Fence: 1 << 62},
	} {
		for _, token := range []string{"", "t", "3:abc", strings.Repeat("z", 1000)} {
			got, err := decodeRecord([]byte(encodeRecord(recordOwner(token), rec)))
			if err != nil || got.Fingerprint != rec.Fingerprint || string(got.Response) != string(rec.Response) || got.Fence != rec.Fence {
				t.Fatalf("round trip of %+v by %q: %+v, %v", rec, token, got, err)
			}
		}
	}
	for _, bad := range []string{"", "x", recordPrefix, recordPrefix + "5:ab", recordPrefix + "1:t", recordPrefix + "1:tx:2:a", recordPrefix + "1:t7:9:ab"} {
		if rec, err := decodeRecord([]byte(bad)); err == nil {
			t.Errorf("decodeRecord(%q) = %+v, want an error", bad, rec)
		}
	}
}
