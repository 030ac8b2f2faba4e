package holders

import (
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	for _, c := range []struct{ table, want string }{
		{"reqlock_locks", "reqlock_locks_holders"},
		{"locks.reqlock_locks", "locks.reqlock_locks_holders"},
	} {
		if got := Table(c.table, 63); got != c.want {
			t.Errorf("Table(%q) = %q, want %q", c.table, got, c.want)
		}
	}
	long := strings.Repeat("t", 60)
	got := Table("s."+long, 63)
	if !strings.HasPrefix(got, "s.reqlock_holders_") || len(got)-len("s.") > 63 {
		t.Errorf("Table of a 60-byte name = %q, want s.reqlock_holders_ and a digest within 63 bytes", got)
	}
	if Table(long, 63) == Table(strings.Repeat("u", 60), 63) {
		t.Error("two long names share a holders table")
	}
}

func TestWriters(t *testing.T) {
	var w Writers
	if got := w.Take([]string{"k"}, "t"); got != nil {
		t.Fatalf("Take with no notes = %q", got)
	}
	w.Add("k1", "t")
	w.Add("k2", "t")
	w.Add("k1", "u")
	if got := w.Take([]string{"k1", "k2", "k3"}, "t"); strings.Join(got, ",") != "k1,k2" {
		t.Fatalf("Take(k1 k2 k3, t) = %q, want k1 k2", got)
	}
	if got := w.Take([]string{"k1", "k2"}, "t"); got != nil {
		t.Fatalf("a second Take = %q, want none: taken notes are forgotten", got)
	}
	if got := w.Take([]string{"k1"}, "u"); len(got) != 1 {
		t.Fatalf("Take(k1, u) = %q, want k1: another token's note stays", got)
	}
}
