package mysqlstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// wantColumn is what the Store needs of one column of its table.
type wantColumn struct {
	name      string
	types     []string // DATA_TYPE, one of
	minLen    int64    // CHARACTER_MAXIMUM_LENGTH, in bytes for a VARBINARY, at least
	precision int64    // DATETIME_PRECISION, exactly, or -1
	key       bool     // the primary key
	needs     string   // what the column must be, for the message
}

// wantColumns are the columns the Store reads and writes. A key must fit
// whole and be compared byte for byte (VARBINARY, not a VARCHAR with a
// collation); expires_at must keep microseconds (a DATETIME without them
// rounds an expiry to the second, and the release's instant long past,
// 1970-01-01 00:00:00, does not fit a TIMESTAMP).
var wantColumns = []wantColumn{
	{name: "lock_key", types: []string{"varbinary"}, minLen: MaxKeyLen, precision: -1, key: true, needs: "VARBINARY(512) PRIMARY KEY"},
	{name: "token", types: []string{"varbinary"}, minLen: MaxTokenLen, precision: -1, needs: "VARBINARY(255)"},
	{name: "expires_at", types: []string{"datetime"}, precision: 6, needs: "DATETIME(6)"},
	{name: "fence", types: []string{"bigint"}, precision: -1, needs: "BIGINT"},
}

// columnsSQL reads the columns of a table, in the connection's database
// when the first argument is NULL. Arguments: database or NULL, table.
const columnsSQL = `SELECT LOWER(COLUMN_NAME), LOWER(DATA_TYPE), COALESCE(CHARACTER_MAXIMUM_LENGTH, 0),
  COALESCE(DATETIME_PRECISION, -1), COLUMN_KEY, COLUMN_TYPE
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`

// checkSchema returns an error wrapping ErrMisconfigured, naming the
// column and what it must be, unless the Store's table has the columns it
// needs: a table made by hand, or by an older schema, that cannot hold what
// the Store writes would otherwise lose precision silently.
func (s *Store) checkSchema(ctx context.Context) error {
	var database any // NULL: the connection's
	table := s.table
	if db, t, ok := strings.Cut(s.table, "."); ok {
		database, table = db, t
	}
	rows, err := s.db.QueryContext(ctx, columnsSQL, database, table)
	if err != nil {
		return fmt.Errorf("mysqlstore: reading the columns of table %s: %w", s.table, markUnreachable(err))
	}
	defer rows.Close()
	type column struct {
		dataType, key, columnType string
		length, precision         int64
	}
	found := make(map[string]column)
	for rows.Next() {
		var (
			name string
			c    column
		)
		if err := rows.Scan(&name, &c.dataType, &c.length, &c.precision, &c.key, &c.columnType); err != nil {
			return fmt.Errorf("%w: the columns of table %s: %w", ErrUnexpectedReply, s.table, err)
		}
		found[name] = c
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("mysqlstore: reading the columns of table %s: %w", s.table, markUnreachable(err))
	}
	if len(found) == 0 {
		return fmt.Errorf("%w: table %s not found: create it from Schema, or let the Store create it (no WithoutCreateTable)", ErrMisconfigured, s.table)
	}
	for _, want := range wantColumns {
		c, ok := found[want.name]
		switch {
		case !ok:
			return fmt.Errorf("%w: table %s has no column %s %s (see Schema)", ErrMisconfigured, s.table, want.name, want.needs)
		case !slices.Contains(want.types, c.dataType) || c.length < want.minLen ||
			(want.precision >= 0 && c.precision != want.precision) || (want.key && c.key != "PRI"):
			key := ""
			if c.key == "PRI" {
				key = " PRIMARY KEY"
			}
			return fmt.Errorf("%w: column %s of table %s is %s%s, want %s (see Schema)",
				ErrMisconfigured, want.name, s.table, c.columnType, key, want.needs)
		}
	}
	return nil
}
