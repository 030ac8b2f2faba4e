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
-- max(last + 1, now), kept for retention ms.
local function issue_fence(fk, last, now, retention)
  local fence = math.max(last + 1, now)
  -- %.0f, not tostring: tostring prints 1.7e+15.
  redis.call('SET', fk, string.format('%.0f', fence), 'PX', retention)
  return fence
end

-- record_fence raises fence key fk to used, the highest fence used under a
-- grant that ends, when that is higher than what fk holds (0: only the
-- grant's own fence, which fk already holds).
local function record_fence(fk, used, retention)
  used = tonumber(used) or 0
  if used > 0 and used > (tonumber(redis.call('GET', fk) or '0') or 0) then
    redis.call('SET', fk, string.format('%.0f', used), 'PX', retention)
  end
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
