package middleware

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Recording records the response of a request to a route with idempotency
// as the handler writes it, for the request's record (see Idempotency). The
// Guard hands one to its adapter's next (see Guard.ServeResponse); the
// adapter makes the handler write through Writer. It is safe for
// concurrent use.
type Recording struct {
	mu       sync.Mutex
	g        *Guard
	w        http.ResponseWriter // the writer Writer wraps
	before   http.Header         // the headers set before the handler ran
	header   http.Header         // the headers as the response's header was written
	status   int                 // the first final status written; 0 before
	body     []byte
	over     bool // the body went over the route's limit
	rejected bool // a guard inside the route rejected the request
	hijacked bool
	flushed  int // the body's length at the first flush; -1 before

	idem     *IdempotentRequest // the handler's view of the request's claim
	declared []byte             // the response the handler recorded itself (IdempotentRequest.Record); nil if none
}

// newRecording returns the Recording of a response whose header map is
// header, before the handler runs.
func newRecording(g *Guard, header http.Header) *Recording {
	return &Recording{g: g, before: header.Clone(), flushed: -1}
}

// Writer returns w, the writer the handler writes to, wrapped so that
// everything written through it is recorded as it goes on to w. Call it
// once per request. The writer it returns implements http.Flusher and
// http.Hijacker when w does, and Unwrap (see http.ResponseController).
//
// When w has a method Status() int (gin's writer), the response's status is
// taken from it once the handler returns, since such a writer may change
// the status until the body is written. A method WriteHeaderNow() of w
// (gin's) is reached through the writer's own, which records the headers
// it sends.
func (rc *Recording) Writer(w http.ResponseWriter) http.ResponseWriter {
	rc.mu.Lock()
	rc.w = w
	rc.mu.Unlock()
	return recordingWriter{rc}
}

// recordingWriter is the writer Recording.Writer returns.
type recordingWriter struct{ rc *Recording }

func (w recordingWriter) Header() http.Header { return w.rc.w.Header() }

func (w recordingWriter) WriteHeader(code int) {
	w.rc.writeHeader(code)
	w.rc.w.WriteHeader(code)
}

func (w recordingWriter) Write(b []byte) (int, error) {
	w.rc.write(b)
	return w.rc.w.Write(b)
}

// WriteString writes s, as io.StringWriter.
func (w recordingWriter) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

// Flush flushes the underlying writer, when it can.
func (w recordingWriter) Flush() {
	w.rc.write(nil) // a flush writes the header
	w.rc.mu.Lock()
	if w.rc.flushed < 0 {
		w.rc.flushed = len(w.rc.body)
	}
	w.rc.mu.Unlock()
	_ = http.NewResponseController(w.rc.w).Flush()
}

// Hijack hijacks the connection, when the underlying writer can; the
// response is then not recorded.
func (w recordingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.rc.w).Hijack()
	if err == nil {
		w.rc.mu.Lock()
		w.rc.hijacked = true
		w.rc.mu.Unlock()
	}
	return conn, rw, err
}

// WriteHeaderNow sends the header at once, recording the headers as they go
// out, when the underlying writer can (gin's); otherwise it does nothing.
func (w recordingWriter) WriteHeaderNow() {
	if now, ok := w.rc.w.(interface{ WriteHeaderNow() }); ok {
		w.rc.write(nil)
		now.WriteHeaderNow()
	}
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (w recordingWriter) Unwrap() http.ResponseWriter { return w.rc.w }

// writeHeader records a final status written, the first one, and the
// headers as they are then; a writer that writes its header lazily (one
// with a Status method, gin's) sends the headers set until the body's first
// write, when they are recorded.
func (rc *Recording) writeHeader(code int) {
	if code < 200 {
		return // informational: the final header comes later
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.status == 0 {
		rc.status = code
	}
	if _, lazy := rc.w.(interface{ Status() int }); !lazy && rc.header == nil {
		rc.header = rc.w.Header().Clone()
	}
}

// write records b, written to the body, up to the route's limit.
func (rc *Recording) write(b []byte) {
	rc.writeHeader(http.StatusOK)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.header == nil {
		rc.header = rc.w.Header().Clone()
	}
	if rc.over {
		return
	}
	if int64(len(rc.body)+len(b)) > rc.g.idem.cfg.MaxBodyBytes {
		rc.over, rc.body = true, nil
		return
	}
	rc.body = append(rc.body, b...)
}

// recorded returns the response the handler recorded itself, or nil.
func (rc *Recording) recorded() []byte {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.declared
}

// whyStatus is result's reason for a response whose status is not
// recorded, by design.
const whyStatus = "status"

// result returns the encoded record of the response, or why it is not
// recorded: whyStatus for a status that is not recorded (see
// recordedStatus), a rejection by reqlock, or else a problem to log.
func (rc *Recording) result() ([]byte, string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	status, header := rc.status, rc.header
	if status == 0 {
		status = http.StatusOK // nothing written: the router answers 200
	}
	if rc.w != nil {
		if s, ok := rc.w.(interface{ Status() int }); ok && s.Status() >= 200 {
			status = s.Status()
		}
		if header == nil {
			header = rc.w.Header()
		}
	}
	switch {
	case rc.w == nil:
		return nil, "the adapter did not record the response (Recording.Writer was not called)"
	case rc.rejected || !recordedStatus(status):
		return nil, whyStatus
	case rc.hijacked:
		return nil, "the handler hijacked the connection"
	case rc.over:
		return nil, fmt.Sprintf("the response body is over the route's idempotency max body of %d bytes", rc.g.idem.cfg.MaxBodyBytes)
	}
	fields := recordedHeader(rc.before, header)
	if f, ok := rc.sniffed(status, header); ok {
		fields = append(fields, f)
		slices.SortFunc(fields, func(a, b field) int { return strings.Compare(a.name, b.name) })
	}
	resp, ok := encodeResponse(status, fields, rc.body)
	if !ok {
		return nil, fmt.Sprintf("the response headers are over %d bytes", MaxRecordedHeaderBytes)
	}
	return resp, ""
}

// sniffed returns the Content-Type field the response went out with when
// the handler set none and a flush cut short what net/http sniffed it from:
// the type of the body written before the first flush, or a field without
// values when nothing was (net/http then sends none, and so does a replay
// with this field). A replay of any other response sniffs its whole body
// as the first answer did, or keeps the handler's field.
func (rc *Recording) sniffed(status int, header http.Header) (field, bool) {
	_, typed := header["Content-Type"]
	if typed || rc.flushed < 0 || len(rc.body) == 0 || header.Get("Content-Encoding") != "" ||
		header.Get("Transfer-Encoding") != "" || status == http.StatusNoContent || status == http.StatusNotModified {
		return field{}, false
	}
	prefix := rc.body[:min(rc.flushed, len(rc.body))]
	if len(prefix) == 0 {
		return field{name: "Content-Type", values: []string{}}, true
	}
	return field{name: "Content-Type", values: []string{http.DetectContentType(prefix)}}, true
}

// recordedStatus reports whether a response with status is recorded: below
// 500 (a retry after a server fault runs again), except 401, 408, 423, 425
// and 429, which tell the client to retry (with credentials, or later),
// whoever answers them.
func recordedStatus(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusRequestTimeout, http.StatusLocked, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// field is one recorded header field.
type field struct {
	name   string
	values []string
}

// notRecorded are the header fields a record never keeps: those of the
// connection, the date, cookies (a credential of one response) and a
// replay's own mark.
var notRecorded = []string{"Connection", "Date", "Keep-Alive", "Proxy-Connection", "Set-Cookie", "Te",
	"Trailer", "Transfer-Encoding", "Upgrade", ReplayedHeader}

// recordedHeader returns the fields of header that the handler set (absent
// from before, or with other values), less those notRecorded and trailers,
// sorted by name.
func recordedHeader(before, header http.Header) []field {
	var fields []field
	for name, values := range header {
		if slices.Contains(notRecorded, name) || strings.HasPrefix(name, http.TrailerPrefix) {
			continue
		}
		if old, ok := before[name]; ok && slices.Equal(old, values) {
			continue
		}
		fields = append(fields, field{name, slices.Clone(values)})
	}
	slices.SortFunc(fields, func(a, b field) int { return strings.Compare(a.name, b.name) })
	return fields
}

// recordVersion is the first byte of a record's response encoding.
const recordVersion = 1

// encodeResponse encodes a response: the version, the status, the number
// of header fields, each field's name and its values (each length-prefixed,
// uvarints), then the body. It reports false when the header fields take
// more than MaxRecordedHeaderBytes.
func encodeResponse(status int, fields []field, body []byte) ([]byte, bool) {
	b := []byte{recordVersion}
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(len(fields)))
	start := len(b)
	for _, f := range fields {
		b = appendString(b, f.name)
		b = binary.AppendUvarint(b, uint64(len(f.values)))
		for _, v := range f.values {
			b = appendString(b, v)
		}
	}
	if len(b)-start > MaxRecordedHeaderBytes {
		return nil, false
	}
	return append(b, body...), true
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// response is a decoded record's response.
type response struct {
	status int
	header []field
	body   []byte
}

// errBadRecord is the error of a record that does not decode.
var errBadRecord = errors.New("reqlock/middleware: the record's response does not decode")

// decodeResponse decodes what encodeResponse encoded. It never panics: any
// other bytes are an error wrapping errBadRecord.
func decodeResponse(b []byte) (response, error) {
	var resp response
	if len(b) == 0 || b[0] != recordVersion {
		return resp, fmt.Errorf("%w: unknown version", errBadRecord)
	}
	d := decoder{b: b[1:]}
	status := d.uvarint()
	n := d.uvarint()
	if d.err != nil || status < 200 || status > 999 || n > uint64(len(d.b)) {
		return resp, fmt.Errorf("%w: bad status or header count", errBadRecord)
	}
	resp.status = int(status)
	for range n {
		name := d.string()
		nv := d.uvarint()
		if d.err != nil || nv > uint64(len(d.b)) {
			return resp, fmt.Errorf("%w: bad header", errBadRecord)
		}
		values := make([]string, 0, nv)
		for range nv {
			values = append(values, d.string())
		}
		if d.err != nil {
			return resp, fmt.Errorf("%w: bad header value", errBadRecord)
		}
		resp.header = append(resp.header, field{name, values})
	}
	resp.body = d.b
	return resp, nil
}

// decoder reads uvarints and length-prefixed strings from b, remembering
// the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errBadRecord
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errBadRecord
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
