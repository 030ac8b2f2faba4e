-- Fence helpers, prepended to every script that issues fences (see
-- withFenceLib in redisstore.go), so that one definition serves them all.

-- now_us returns the server clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- fence_check is how many grants of a key pass between two checks of its
-- fence against the clock (see next_fence).
local fence_check = 64

-- next_fence issues, stores and returns the next fence of fence key fk, or
-- nil and an error reply when fk holds no fence (after which the caller
-- undoes what it wrote). A fence is the last one plus stride, the least
-- step between two grants' fences (stores.FenceStride), in one INCRBY,
-- which keeps fk's TTL. A missing fk starts from the server clock in
-- microseconds, and is kept for retention ms.
--
-- Once fk expires the clock alone must exceed every fence it held. So
-- every fence_check-th grant (when fence/stride crosses a multiple of
-- fence_check) reads the clock and keeps fk for retention plus the lead of
-- the fence over the clock, if any: up to the next check, fences grow by
-- at most fence_check strides (65 ms), far less than the retention (1
-- minute at least), so fk outlives the time the clock takes to pass them.
local function next_fence(fk, retention, stride)
  local fence = redis.pcall('INCRBY', fk, stride)
  if type(fence) ~= 'number' or fence >= 9007199254740992 then
    return nil, redis.error_reply('reqlock: fence key ' .. fk .. ' does not hold a fence')
  end
  if fence == stride then
    -- fk was missing: its fences, if any, are all behind the clock.
    fence = math.max(now_us(), stride)
    -- %.0f, not tostring: tostring prints 1.7e+15.
    redis.call('SET', fk, string.format('%.0f', fence), 'PX', retention)
  elseif math.floor(fence / stride) % fence_check == 0 then
    local lead = math.max(fence - now_us(), 0)
    redis.call('PEXPIRE', fk, tonumber(retention) + math.ceil(lead / 1000))
  end
  return fence
end

-- own_retry reports whether lock key k, whose value is v, already holds
-- token (a retried call of the acquisition that set it, whose reply was
-- lost) and then resets its TTL to ttl ms, as a fresh grant would. It keeps
-- the key's mark: waiters refused meanwhile still wait.
local function own_retry(k, v, token, ttl)
  if holds(v, token) then
    redis.call('PEXPIRE', k, ttl)
    return true
  end
  return false
end
