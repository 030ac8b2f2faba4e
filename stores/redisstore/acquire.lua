-- KEYS[1] lock key, KEYS[2] fence key (same slot)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence stride
-- Returns {1, fence} when granted, else {0, pttl of the holder}.
-- The fence key is read and checked before anything is written, so a bad
-- fence key fails the call without leaving a lock behind.
-- A key that already holds the token was set by this same call, run before
-- (the client retried after losing the reply): it is granted again.
local last, err = last_fence(KEYS[2])
if err then
  return err
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) or own_retry(KEYS[1], ARGV[1], ARGV[2]) then
  return {1, issue_fence(KEYS[2], last, now_us(), ARGV[3], tonumber(ARGV[4]))}
end
return {0, redis.call('PTTL', KEYS[1])}
