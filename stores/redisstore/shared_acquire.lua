-- One AcquireShared: makes the token one of the key's holders.
-- KEYS[1] lock key (a sorted set of holders while held shared; see
-- shared_lib.lua), KEYS[2] fence key, KEYS[3] the key's writers (see
-- writer_waits), KEYS[4] waiting key, KEYS[5] the token's abandon mark (see
-- refuse_abandoned); all in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] fence
-- stride, ARGV[5] limit (0: any number).
-- Returns {1, fence} when granted, else {0, wait ms} and marks the key
-- waited for (see mark_waiting). The fence comes from the fence key that
-- exclusive grants use.
local abandoned = refuse_abandoned(KEYS[5])
if abandoned then
  return abandoned
end
local token, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local nowus = now_us()
local now = math.floor(nowus / 1000)

local function refuse(wait)
  mark_waiting(KEYS[4], wait)
  return {0, wait}
end

-- grant sets the token's place for ttl and issues its fence; freed: the
-- call found places freed by expiry, which it signals (see signal_freed).
local function grant(retry, freed)
  redis.call('ZADD', KEYS[1], fmt(now + ttl), token)
  expire_holders(KEYS[1])
  local fence, err = issue_fence(KEYS[2], nowus, ARGV[3], tonumber(ARGV[4]))
  if err then
    if not retry then
      redis.call('ZREM', KEYS[1], token)
      expire_holders(KEYS[1])
    end
    return err
  end
  if freed then
    signal_freed(KEYS[1], KEYS[4])
  end
  return {1, fence}
end

local kind = holders_type(KEYS[1])
if kind ~= 'none' and kind ~= 'zset' then
  return refuse(redis.call('PTTL', KEYS[1])) -- held exclusively
end
if kind == 'zset' then
  prune_holders(KEYS[1], KEYS[4], now)
  if redis.call('ZSCORE', KEYS[1], token) then
    return grant(true, false) -- a retry: whatever the count and the writers
  end
end
local left = writer_window_left(KEYS[3], now)
if left > 0 then
  return refuse(left)
end
if kind == 'zset' and limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then
  local soonest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return refuse(tonumber(soonest[2]) - now)
end
-- A free key was held by somebody a caller was refused (the waiting key
-- is there) and has expired since: signal it.
return grant(false, kind == 'none')
