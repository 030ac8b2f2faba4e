-- Takes several keys at once, all or none.
-- KEYS[1..n] lock keys, KEYS[n+1..2n] their fence keys (KEYS[n+i] is the
-- fence key of KEYS[i]); all in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence stride
-- Returns {1, fence of KEYS[1], ..., fence of KEYS[n]} when granted, else
-- {0, index (0-based) of the first held key, its pttl} and writes nothing.
-- Every fence key is read and checked before anything is written, so a bad
-- fence key fails the call without leaving a lock behind.
-- A key that already holds the token counts as free: this same call set
-- it before (the client retried after losing the reply).
local n = #KEYS / 2
for i = 1, n do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl ~= -2 and redis.pcall('GET', KEYS[i]) ~= ARGV[1] then
    return {0, i - 1, pttl}
  end
end
local last = {}
for i = 1, n do
  local l, err = last_fence(KEYS[n + i])
  if err then
    return err
  end
  last[i] = l
end
local now = now_us()
local reply = {1}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  reply[i + 1] = issue_fence(KEYS[n + i], last[i], now, ARGV[3], tonumber(ARGV[4]))
end
return reply
