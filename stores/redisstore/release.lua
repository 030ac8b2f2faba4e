-- KEYS[1] lock key, KEYS[2] fence key (same slot)
-- ARGV[1] token, ARGV[2] highest fence used under this grant (0: only the
-- grant's own, which the fence key already holds), ARGV[3] fence retention ms
-- Returns 1 when released, 0 when not held. A release is published on the
-- channel named after the lock key, so that waiters wake without polling.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
record_fence(KEYS[2], ARGV[2], ARGV[3])
redis.call('PUBLISH', KEYS[1], 'released')
return 1
