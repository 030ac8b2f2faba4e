package pgstore

import (
	"context"
	"time"
)

// PurgeShort is Purge without its check of the retention, so that tests
// can purge rows a few milliseconds old.
func (s *Store) PurgeShort(ctx context.Context, retention time.Duration) (int64, error) {
	return s.purge(ctx, retention, 0)
}

// WithShortPurge is WithPurge that accepts a retention below MinRetention.
func WithShortPurge(interval, retention time.Duration) Option {
	return func(s *Store) {
		s.purgeEvery, s.retention, s.minRetention = interval, retention, 0
	}
}
