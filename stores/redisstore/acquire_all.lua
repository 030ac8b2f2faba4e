-- Takes several keys at once, all or none.
-- KEYS[1..n] lock keys, KEYS[n+1..2n] their fence keys, KEYS[2n+1..3n] their
-- waiting keys, KEYS[3n+1..4n] the token's writer marks on them,
-- KEYS[4n+1..5n] their writers (see writer_waits) (KEYS[n+i], KEYS[2n+i],
-- ... belong to KEYS[i]), KEYS[5n+1] the token's abandon mark (see
-- refuse_abandoned); all in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence
-- stride, ARGV[5] writer window ms (stores.WriterWindow)
-- Returns {1, fence of KEYS[1], ..., fence of KEYS[n]} when granted, else
-- {0, index (0-based) of the first held key, its pttl, 1 when shared holders
-- hold it (the token is then recorded as a waiting writer on it) else 0},
-- writing nothing but that key's waiting mark (see mark_waiting) and writer
-- record. A bad fence key fails the call and the locks it set are deleted
-- again, so it leaves no lock behind.
-- A key that already holds the token counts as free: this same call set
-- it before (the client retried after losing the reply).
local n = (#KEYS - 1) / 5
local am = KEYS[#KEYS]
-- One EXISTS of the abandon mark and the writer marks: an acquire of a
-- token that neither was abandoned nor waits as a writer pays no more.
local marked = redis.call('EXISTS', am, unpack(KEYS, 3 * n + 1, 4 * n)) > 0
if marked then
  local abandoned = refuse_abandoned(am)
  if abandoned then
    return abandoned
  end
end
for i = 1, n do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl ~= -2 then
    local cur = redis.pcall('GET', KEYS[i])
    if cur ~= ARGV[1] then
      local shared = 0
      if held_shared(KEYS[i], cur) then
        writer_waits(KEYS[4 * n + i], KEYS[3 * n + i], ARGV[1], tonumber(ARGV[5]))
        shared = 1
      end
      mark_waiting(KEYS[2 * n + i], pttl)
      return {0, i - 1, pttl, shared}
    end
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
for i = 1, marked and n or 0 do
  if redis.call('DEL', KEYS[3 * n + i]) == 1 then
    redis.call('ZREM', KEYS[4 * n + i], ARGV[1])
  end
end
return reply
