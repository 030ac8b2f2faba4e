-- Fence helpers, prepended to every script that issues or records fences
-- (see withFenceLib in redisstore.go), so that one definition serves them all.

-- last_fence returns the last fence stored in fence key fk (0 when absent),
-- or nil and an error reply when fk holds something else. Callers check it
-- before they write anything, so a bad fence key leaves nothing behind.
local function last_fence(fk)
  local last = tonumber(redis.call('GET', fk) or '0')
  if last == nil or last >= 9007199254740992 then
    return nil, redis.error_reply('reqlock: fence key ' .. fk .. ' does not hold a fence')
  end
  return last
end

-- now_us returns the server clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- issue_fence stores and returns the next fence of fence key fk:
-- max(last + stride, now), with stride the least step between two grants'
-- fences (stores.FenceStride). It keeps fk for retention ms, and longer while
-- the fence is ahead of the clock (many grants within a stride of
-- microseconds), so that once fk expires the clock alone exceeds every fence
-- it held.
local function issue_fence(fk, last, now, retention, stride)
  local fence = math.max(last + stride, now)
  local keep = tonumber(retention) + math.ceil((fence - now) / 1000)
  -- %.0f, not tostring: tostring prints 1.7e+15.
  redis.call('SET', fk, string.format('%.0f', fence), 'PX', keep)
  return fence
end

-- own_retry reports whether lock key k already holds token (a retried call
-- of the acquisition that set it, whose reply was lost) and then resets its
-- TTL to ttl ms, as a fresh grant would. A key of another type than a string
-- does not hold the token.
local function own_retry(k, token, ttl)
  if redis.pcall('GET', k) == token then
    redis.call('PEXPIRE', k, ttl)
    return true
  end
  return false
end
