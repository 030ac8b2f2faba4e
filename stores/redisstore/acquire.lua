-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] waiting key, KEYS[4] the
-- token's abandon mark (see refuse_abandoned), KEYS[5] its writer mark and
-- KEYS[6] the key's writers (see writer_waits); all in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence
-- stride, ARGV[5] writer window ms (stores.WriterWindow)
-- Returns {1, fence} when granted, else {0, pttl of the holder, 1 when
-- shared holders hold the key (the token is then recorded as a waiting
-- writer) else 0}, and then marks the key waited for (see mark_waiting).
-- A key that already holds the token was set by this same call, run before
-- (the client retried after losing the reply): it is granted again.
local abandoned, writer = check_marks(KEYS[4], KEYS[5])
if abandoned then
  return abandoned
end
local granted, cur = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]), nil
if not granted then
  granted, cur = own_retry(KEYS[1], ARGV[1], ARGV[2])
end
if granted then
  local fence, err = issue_fence(KEYS[2], now_us(), ARGV[3], tonumber(ARGV[4]))
  if err then
    redis.call('DEL', KEYS[1])
    return err
  end
  if writer then
    writer_granted(KEYS[6], KEYS[5], ARGV[1])
  end
  return {1, fence}
end
local pttl = redis.call('PTTL', KEYS[1])
local shared = 0
if held_shared(KEYS[1], cur) then
  writer_waits(KEYS[6], KEYS[5], ARGV[1], tonumber(ARGV[5]))
  shared = 1
end
mark_waiting(KEYS[3], pttl)
return {0, pttl, shared}
