package redisstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// crossSlotFix tells how to put the keys of one call in one slot.
const crossSlotFix = "Redis Cluster hashes only the part of a key between its first '{' and the next '}' " +
	"(the whole key when there is no such pair or nothing between them), so give every key of the call " +
	"the same hash tag, such as the key template \"cart:{<json:cart>}:sku:<json:items[*].sku>\", " +
	"whose keys all hash to the slot of their cart"

// routingOf returns how client spreads keys, when its type tells. A client
// hidden behind a wrapper is taken as one server; a Cluster then still
// answers CROSSSLOT, which the multi-key calls map to ErrCrossSlot.
func routingOf(client redis.Scripter) Routing {
	switch client.(type) {
	case *redis.ClusterClient:
		return RouteSlot
	case *redis.Ring:
		return RouteShard
	}
	return RouteOne
}

// hashPart is the part of key that Redis Cluster hashes, and that a Ring
// picks its shard by: the hash tag (what lies between the first '{' and the
// next '}', when not empty), else the whole key.
func hashPart(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end]
		}
	}
	return key
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slot is the Redis Cluster hash slot of key, honouring hash tags.
func slot(key string) uint16 {
	return crc16(hashPart(key)) % 16384
}

// checkColocated returns an error wrapping ErrCrossSlot when the client
// spreads keys over servers and keys, with their fence keys when withFences
// is set, would not all land on one. It does no I/O.
func (s *Store) checkColocated(keys []string, withFences bool) error {
	if s.routing == RouteOne {
		return nil
	}
	return colocationError(s.routing, keys, withFences)
}

// colocationError returns the ErrCrossSlot error for the first pair of keys
// that route apart under r, or nil when they all route together.
func colocationError(r Routing, keys []string, withFences bool) error {
	where := func(key string) string { return hashPart(key) }
	if r == RouteSlot {
		where = func(key string) string { return fmt.Sprint(slot(key)) }
	}
	first := where(keys[0])
	for _, k := range keys[1:] {
		if where(k) != first {
			return crossError(r, keys[0], k)
		}
	}
	if withFences {
		for _, k := range keys {
			if fk := fenceKey(k); where(fk) != first {
				return fmt.Errorf("%w: the fence key %q of %q %s: a key that contains '}' must have "+
					"a hash tag, a '{' followed later by a '}' with at least one character between; %s",
					ErrCrossSlot, fk, k, placeOf(r, fk, k), crossSlotFix)
			}
		}
	}
	return nil
}

// crossError names two keys of one call that route apart under r.
func crossError(r Routing, a, b string) error {
	if r == RouteShard {
		return fmt.Errorf("%w: keys %q and %q may live on different Ring shards (a Ring picks the shard by "+
			"the same part of a key that Redis Cluster hashes); %s", ErrCrossSlot, a, b, crossSlotFix)
	}
	return fmt.Errorf("%w: keys %q (slot %d) and %q (slot %d); %s",
		ErrCrossSlot, a, slot(a), b, slot(b), crossSlotFix)
}

// placeOf says how fence key fk routes apart from its key k, for an error
// message.
func placeOf(r Routing, fk, k string) string {
	if r == RouteShard {
		return fmt.Sprintf("is placed by %q, the key by %q", hashPart(fk), hashPart(k))
	}
	return fmt.Sprintf("is in slot %d, the key in slot %d", slot(fk), slot(k))
}

// isCrossSlot reports whether err is Redis refusing a command whose keys
// hash to different slots.
func (s *Store) isCrossSlot(err error) bool {
	msg, ok := s.driver.ReplyError(err)
	return ok && strings.HasPrefix(msg, "CROSSSLOT")
}

// mapCrossSlot returns err as is, unless it is the server's CROSSSLOT
// refusal: then an error wrapping both ErrCrossSlot and err that names two
// keys of the call in different slots (computed here), or, should the
// server hash differently, the first and last key sent.
func (s *Store) mapCrossSlot(err error, keys []string, withFences bool) error {
	if !s.isCrossSlot(err) {
		return err
	}
	if named := colocationError(RouteSlot, keys, withFences); named != nil {
		return fmt.Errorf("%w (Redis answered: %w)", named, err)
	}
	last := keys[len(keys)-1]
	if withFences {
		last = fenceKey(last)
	}
	return fmt.Errorf("%w: Redis refused the keys from %q to %q (%w); %s",
		ErrCrossSlot, keys[0], last, err, crossSlotFix)
}

// run runs script on the Store's Driver; every script call goes through it.
func (s *Store) run(ctx context.Context, script *Script, keys []string, args ...any) (Reply, error) {
	return s.driver.Eval(ctx, script, keys, args)
}
