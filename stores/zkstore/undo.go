package zkstore

import (
	"errors"
	"log/slog"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/reqlock/reqlock/stores"
)

// undo releases token's grant of keys, and with fair its queue place, after
// an abandoned call, trying again while the server cannot be reached: the
// grant must not stand for its whole TTL because a first try failed. It
// returns once the grant is released or found gone, or the Store closed, or
// the session of the call ended (the server deleted its ephemeral nodes),
// or on an error that trying again would not cure (logged: the grant then
// stands until its TTL passes or the session ends).
func (s *Store) undo(keys []string, token string, fair bool) {
	s.retryUndo(keys[0], len(keys), func() error {
		err := s.release(keys, token, 0)
		if (err == nil || errors.Is(err, stores.ErrNotHeld)) && fair {
			err = s.leaveFair(nil, keys[0], token)
		}
		return err
	})
}

// retryUndo runs release, the clean-up of an abandoned call on key (of
// keys keys), as undo describes: until it succeeds or answers
// stores.ErrNotHeld, or trying again would not help.
func (s *Store) retryUndo(key string, keys int, release func() error) {
	// The call's requests, all returned, went out in this session or an
	// earlier one: once it has ended, every node they made is gone.
	session := s.conn.SessionID()
	pause := rearmDelay
	for {
		if session == 0 || s.conn.SessionID() != session {
			return
		}
		err := release()
		if err == nil || errors.Is(err, stores.ErrNotHeld) {
			return
		}
		if !transient(err) {
			if s.isClosed() {
				return // the session is closed: the server deleted every node of it
			}
			s.log.Warn("zkstore: the clean-up of an abandoned call failed; what it made stands until its TTL passes or the session ends",
				slog.String("key", stores.KeyForMessage(key)), slog.Int("keys", keys), slog.Any("error", err))
			return
		}
		select {
		case <-s.done:
			return // the session is closed: the server deleted every node of it
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// transient reports whether err, the failure of a request, may not happen
// again: the connection was lost or no server could be reached, the
// session moved or ended, or other writers kept changing the nodes.
func transient(err error) bool {
	for _, t := range []error{zk.ErrConnectionClosed, zk.ErrNoServer, zk.ErrSessionExpired, zk.ErrSessionMoved,
		zk.ErrNodeExists, zk.ErrBadVersion, zk.ErrNotEmpty} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
