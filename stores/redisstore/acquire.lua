-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] waiting key, KEYS[4] the
-- token's abandon mark (see refuse_abandoned); all in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence stride
-- Returns {1, fence} when granted, else {0, pttl of the holder}, and then
-- marks the key waited for (see mark_waiting).
-- A key that already holds the token was set by this same call, run before
-- (the client retried after losing the reply): it is granted again.
local abandoned = refuse_abandoned(KEYS[4])
if abandoned then
  return abandoned
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) or own_retry(KEYS[1], ARGV[1], ARGV[2]) then
  local fence, err = issue_fence(KEYS[2], now_us(), ARGV[3], tonumber(ARGV[4]))
  if err then
    redis.call('DEL', KEYS[1])
    return err
  end
  return {1, fence}
end
local pttl = redis.call('PTTL', KEYS[1])
mark_waiting(KEYS[3], pttl)
return {0, pttl}
