package mysqlstore

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/reqlock/reqlock/stores"
)

var (
	// ErrUnexpectedReply means the server answered in a shape this package
	// does not expect, such as a table of another program under the
	// store's table name, or a driver that does not report LAST_INSERT_ID.
	ErrUnexpectedReply = errors.New("mysqlstore: unexpected reply from the server")

	// ErrClosed means the Store was closed.
	ErrClosed = errors.New("mysqlstore: store closed")

	// ErrContention means a Release or Refresh lost every one of its
	// attempts to contention for row locks (deadlocks or lock wait
	// timeouts, each of which the server rolled back). It wraps the
	// server's last error. Its outcome is known: nothing changed. (An
	// Acquire refuses instead.)
	ErrContention = errors.New("mysqlstore: lost to row lock contention")

	// ErrMisconfigured means the server's sessions or the table are not
	// what the Store needs: sessions that do not commit each statement by
	// themselves (autocommit off), or a table whose columns cannot hold
	// what the Store writes. The error says what to change.
	ErrMisconfigured = errors.New("mysqlstore: server or table not as the store needs")
)

// errAutocommitOff is ErrMisconfigured for a session with autocommit off.
var errAutocommitOff = fmt.Errorf("%w: the session runs with autocommit=0, so that a grant of one statement "+
	"would never commit and vanish with its connection: turn autocommit on (the server's default; the DSN "+
	"parameter autocommit=1, as Open sets it, or my.cnf and init_connect without autocommit=0)", ErrMisconfigured)

// Server error numbers the store tells apart. Both mean the statement (on a
// deadlock, the whole transaction) was rolled back and changed nothing.
const (
	erLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	erDeadlock        = 1213 // ER_LOCK_DEADLOCK
)

// contended reports whether err is a loss to contention for row locks, not a
// failure of the server: the server chose the statement as a deadlock's
// victim, or it waited innodb_lock_wait_timeout for a row lock. An error of
// go-sql-driver/mysql is recognised by its number; another driver's by the
// server's English message.
func contended(err error) bool {
	if err == nil {
		return false
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == erDeadlock || me.Number == erLockWaitTimeout
	}
	msg := err.Error()
	return strings.Contains(msg, "Deadlock found when trying to get lock") ||
		strings.Contains(msg, "Lock wait timeout exceeded")
}

// markUnreachable wraps err with stores.ErrUnreachable when the call never
// reached the server: no connection could be dialled. Such a call changed
// nothing, so the Locker has nothing to clean up after it.
func markUnreachable(err error) error {
	if err == nil || errors.Is(err, stores.ErrUnreachable) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("%w: mysqlstore: %w", stores.ErrUnreachable, err)
	}
	return err
}

// keysForMessage names keys in an error message: the first, cut short by
// stores.KeyForMessage, and how many others.
func keysForMessage(keys []string) string {
	if len(keys) == 1 {
		return stores.KeyForMessage(keys[0])
	}
	return fmt.Sprintf("%s and %d more keys", stores.KeyForMessage(keys[0]), len(keys)-1)
}
