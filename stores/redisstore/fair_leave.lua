-- Takes a waiter out of the fair queue.
-- KEYS[1] lock key, KEYS[2] queue, KEYS[3] leases (same slot); ARGV[1] token.
-- Returns 1 when the token was queued, else 0. When it headed the queue and
-- the key is free, publishes on the lock key's channel like a release, so the
-- next waiter wakes at once.
redis.call('ZREM', KEYS[3], ARGV[1])
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if not rank then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
if rank == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('PUBLISH', KEYS[1], 'dequeued')
end
return 1
