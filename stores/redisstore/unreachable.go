package redisstore

import (
	"errors"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"

	"github.com/reqlock/reqlock/stores"
)

// markUnreachable wraps err with stores.ErrUnreachable when the call never
// reached Redis: no connection could be dialled, or none came free from
// the pool in time. Such a call changed nothing, so the Locker has nothing
// to clean up after it.
func markUnreachable(err error) error {
	if err == nil || errors.Is(err, stores.ErrUnreachable) {
		return err
	}
	var op *net.OpError
	if (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, redis.ErrPoolTimeout) {
		return fmt.Errorf("%w: %w", stores.ErrUnreachable, err)
	}
	return err
}
