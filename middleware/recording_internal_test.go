package middleware

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// TestResponseEncoding: a response's status, recorded header fields (those
// the handler set, less the connection's, the date and cookies) and body
// come back from a record byte for byte; headers over the bound are not
// recorded.
func TestResponseEncoding(t *testing.T) {
	before := http.Header{"X-Request-Id": {"outer"}, "Vary": {"Origin"}}
	after := http.Header{"X-Request-Id": {"outer"}, "Vary": {"Origin", "Accept"}, "Content-Type": {"application/json"},
		"Set-Cookie": {"s=1"}, "Date": {"today"}, "Connection": {"close"}, "Trailer:X": {"t"}, "X-Empty": {""}}
	fields := recordedHeader(before, after)
	want := []field{{"Content-Type", []string{"application/json"}}, {"Vary", []string{"Origin", "Accept"}}, {"X-Empty", []string{""}}}
	if !reflect.DeepEqual(fields, want) {
		t.Fatalf("recorded fields %v, want %v", fields, want)
	}
	body := []byte{0, 1, 0xff, '\n'}
	enc, ok := encodeResponse(http.StatusCreated, fields, body)
	if !ok {
		t.Fatal("not encoded")
	}
	got, err := decodeResponse(enc)
	if err != nil || got.status != http.StatusCreated || !reflect.DeepEqual(got.header, want) || !bytes.Equal(got.body, body) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if _, ok := encodeResponse(200, []field{{"X-Big", []string{strings.Repeat("v", MaxRecordedHeaderBytes)}}}, nil); ok {
		t.Fatal("headers over MaxRecordedHeaderBytes were encoded")
	}
}

// FuzzDecodeResponse: decodeResponse never panics, and what it accepts
// encodes back to the same bytes.
func FuzzDecodeResponse(f *testing.F) {
	enc, _ := encodeResponse(201, []field{{"Content-Type", []string{"a", "b"}}}, []byte("body"))
	for _, seed := range [][]byte{enc, nil, {1}, {1, 200, 1}, {2, 200, 1, 0}, {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := decodeResponse(b)
		if err != nil {
			return
		}
		again, ok := encodeResponse(resp.status, resp.header, resp.body)
		if ok && !bytes.Equal(again, b) {
			// Varints have one shortest form; a longer one decodes too.
			if back, err := decodeResponse(again); err != nil || !reflect.DeepEqual(back, resp) {
				t.Fatalf("%x decodes to %+v, which does not round-trip", b, resp)
			}
		}
	})
}
