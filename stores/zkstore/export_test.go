package zkstore

import "github.com/go-zookeeper/zk"

// WithDialer makes the Store connect through dial, so that a test can cut
// or stall its network.
func WithDialer(dial zk.Dialer) Option {
	return func(c *config) error {
		c.dialer = dial
		return nil
	}
}

// InFlight returns the number of calls running in the background, their
// clean-ups included.
func (s *Store) InFlight() int64 { return s.inFlight.Load() }

// SessionID returns the Store's current ZooKeeper session.
func (s *Store) SessionID() int64 { return s.conn.SessionID() }
