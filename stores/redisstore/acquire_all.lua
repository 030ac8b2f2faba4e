-- Takes several keys at once, all or none.
-- KEYS[1..n] lock keys, KEYS[n+1..2n] their fence keys, KEYS[2n+1..3n] their
-- waiting keys (KEYS[n+i] and KEYS[2n+i] belong to KEYS[i]), KEYS[3n+1] the
-- token's abandon mark (see refuse_abandoned); all in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence stride
-- Returns {1, fence of KEYS[1], ..., fence of KEYS[n]} when granted, else
-- {0, index (0-based) of the first held key, its pttl}, writing nothing but
-- that key's waiting mark (see mark_waiting). A bad fence key fails the call
-- and the locks it set are deleted again, so it leaves no lock behind.
-- A key that already holds the token counts as free: this same call set
-- it before (the client retried after losing the reply).
local n = (#KEYS - 1) / 3
local abandoned = refuse_abandoned(KEYS[#KEYS])
if abandoned then
  return abandoned
end
for i = 1, n do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl ~= -2 and redis.pcall('GET', KEYS[i]) ~= ARGV[1] then
    mark_waiting(KEYS[2 * n + i], pttl)
    return {0, i - 1, pttl}
  end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
local now = now_us()
local reply = {1}
for i = 1, n do
  local fence, err = issue_fence(KEYS[n + i], now, ARGV[3], tonumber(ARGV[4]))
  if err then
    for j = 1, n do
      redis.call('DEL', KEYS[j])
    end
    return err
  end
  reply[i + 1] = fence
end
return reply
