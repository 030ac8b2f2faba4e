-- Takes several keys at once, all or none.
-- KEYS[1..n] lock keys, KEYS[n+1..2n] their fence keys (KEYS[n+i] is the
-- fence key of KEYS[i]); all in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence stride
-- Returns {1, fence of KEYS[1], ..., fence of KEYS[n]} when granted, else
-- {0, index (0-based) of the first held key, its pttl}, having only marked
-- that key as waited for (see lockvalue.lua).
-- A fence key that holds no fence fails the call, and the locks it took are
-- given back, so nothing is left behind.
-- A key that already holds the token counts as free: this same call set
-- it before (the client retried after losing the reply).
local n = #KEYS / 2
local value = {}
for i = 1, n do
  local v = redis.pcall('GET', KEYS[i])
  if v and not holds(v, ARGV[1]) then
    return {0, i - 1, refused(KEYS[i], v)}
  end
  value[i] = ARGV[1]
  if v then
    local _, marked = holds(v, ARGV[1])
    if marked then
      value[i] = ARGV[1] .. ':w' -- waiters refused meanwhile still wait
    end
  end
end
local reply = {1}
for i = 1, n do
  redis.call('SET', KEYS[i], value[i], 'PX', ARGV[2])
  local fence, err = next_fence(KEYS[n + i], ARGV[3], tonumber(ARGV[4]))
  if err then
    -- Give back every lock this call took; fences issued stay issued.
    for j = 1, i do
      redis.call('DEL', KEYS[j])
    end
    return err
  end
  reply[i + 1] = fence
end
return reply
