-- KEYS[1..n] lock keys, KEYS[n+1..2n] their fence keys, KEYS[2n+1] the node marker.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence
-- stride, ARGV[5] quarantine ms after a data loss, ARGV[6] the first fence
-- the client proposes for a new fence key (its clock in microseconds plus a
-- margin), ARGV[7] the attempt (see closed in lib.lua), ARGV[8] the writer
-- window ms (stores.WriterWindow).
-- Returns {1, fence of KEYS[1], ..., fence of KEYS[n]} when granted;
-- {0, index (0-based) of the first key held by another token, its pttl, a
-- digest of the holder's token, 1 when shared holders hold it (the token is
-- then recorded as a waiting writer on it, see shared_lib.lua) else 0};
-- {-1, ms left} while the node is quarantined; {-2} when an undo or a
-- release of the token closed the attempt, or a later attempt of the token
-- holds a key (a late call). A grant sets each key to TOKEN#ATTEMPT (see
-- owner in lib.lua), so that the undo of an attempt releases that attempt's
-- grants alone, and ends the token's writer records on the keys.
-- A fence is the last one + stride while the fence key lives, so nodes that
-- saw the same grants issue the same fence. A new fence key starts from the
-- client's proposal, so that nodes agree on it too, within [node clock,
-- node clock + 2s].
local n = (#KEYS - 1) / 2
local nowus = now_us()
local wait = quarantine(KEYS[#KEYS], math.floor(nowus / 1000), tonumber(ARGV[5]))
if wait > 0 then
  return {-1, wait}
end
for i = 1, n do
  if closed(KEYS[i], ARGV[1], ARGV[7]) then
    return {-2}
  end
end
for i = 1, n do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl ~= -2 then
    local v = redis.pcall('GET', KEYS[i])
    local t, a = owner(v)
    if t ~= ARGV[1] then
      local shared = 0
      if type(v) == 'table' and redis.call('TYPE', KEYS[i]).ok == 'zset' then
        writer_waits(writers_of(KEYS[i]), writer_mark(KEYS[i], ARGV[1]), ARGV[1], tonumber(ARGV[8]))
        shared = 1
      end
      return {0, i - 1, pttl, digest(v), shared}
    end
    if a > tonumber(ARGV[7]) then
      return {-2}
    end
  end
end
local last = {}
for i = 1, n do
  local l, err = last_fence(KEYS[n + i])
  if l == false then
    return err
  end
  last[i] = l
end
local reply = {1}
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1] .. '#' .. ARGV[7], 'PX', ARGV[2])
  reply[i + 1] = issue_fence(KEYS[n + i], last[i], nowus, ARGV[6], ARGV[4], ARGV[3])
  writer_granted(writers_of(KEYS[i]), writer_mark(KEYS[i], ARGV[1]), ARGV[1])
end
return reply
