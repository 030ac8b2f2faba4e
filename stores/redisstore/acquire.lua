-- KEYS[1] lock key, KEYS[2] fence key (same slot)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence stride
-- Returns {1, fence} when granted, else {0, pttl of the holder}, having
-- marked the key as waited for (see lockvalue.lua).
-- A fence key that holds no fence fails the call, and the lock it took is
-- given back, so nothing is left behind.
-- A key that already holds the token was set by this same call, run before
-- (the client retried after losing the reply): it is granted again.
local granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not granted then
  local v = redis.pcall('GET', KEYS[1])
  if not own_retry(KEYS[1], v, ARGV[1], ARGV[2]) then
    return {0, refused(KEYS[1], v)}
  end
end
local fence, err = next_fence(KEYS[2], ARGV[3], tonumber(ARGV[4]))
if err then
  redis.call('DEL', KEYS[1])
  return err
end
return {1, fence}
