package pgstore

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reqlock/reqlock/stores"
)

// TestClassify: a statement the server refused as beyond one of its limits
// (SQLSTATE 54000, such as an index entry too large on a server with
// smaller pages than Bounds assumes) is an invalid argument, not a store
// failure; other server errors stay as they are.
func TestClassify(t *testing.T) {
	limit := &pgconn.PgError{Code: programLimitExceeded, Message: "index row size 2712 exceeds btree version 4 maximum 2704"}
	if err := classify(limit); !errors.Is(err, stores.ErrInvalid) || !errors.Is(err, limit) {
		t.Fatalf("classify(54000): %v, want stores.ErrInvalid wrapping the server's error", err)
	}
	other := &pgconn.PgError{Code: "57014"} // query_canceled
	if err := classify(other); errors.Is(err, stores.ErrInvalid) || errors.Is(err, stores.ErrUnreachable) {
		t.Fatalf("classify(57014): %v, want the server's error alone", err)
	}
	if got := maxKeyBytes(8192); got != 2692 {
		t.Fatalf("maxKeyBytes(8192) = %d, want 2692 (TestLongKeys checks it on the server)", got)
	}
}
