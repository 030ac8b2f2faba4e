-- Helpers prepended to every script that issues fences or refuses a waiter
-- (see withLib in redisstore.go), so that one definition serves them all.

-- now_us returns the server clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- issue_fence stores and returns the next fence of fence key fk:
-- max(last + stride, now), with last the fence fk held (0 when absent) and
-- stride the least step between two grants' fences (stores.FenceStride). It
-- keeps fk for retention ms, and longer while the fence is ahead of the clock
-- (many grants within a stride of microseconds), so that once fk expires the
-- clock alone exceeds every fence it held.
--
-- It writes now and reads last in one SET ... GET (Redis 6.2 or later), and
-- writes again only when last + stride is ahead of now. When fk holds
-- something else than a fence, it puts that value back (with the retention
-- as its TTL) and returns nil and an error reply; the caller then undoes its
-- grant, so a bad fence key leaves no lock behind.
local function issue_fence(fk, now, retention, stride)
  -- %.0f, not tostring: tostring prints 1.7e+15.
  local prev = redis.pcall('SET', fk, string.format('%.0f', now), 'PX', retention, 'GET')
  if type(prev) == 'table' and prev.err then
    if string.find(prev.err, 'syntax') then
      return nil, redis.error_reply('reqlock: redisstore needs Redis 6.2 or later (SET ... GET): ' .. prev.err)
    end
    return nil, redis.error_reply('reqlock: fence key ' .. fk .. ' does not hold a fence: ' .. prev.err)
  end
  local last = 0
  if prev then
    last = tonumber(prev)
    -- last ~= last: strtod reads "nan".
    if last == nil or last ~= last or last >= 9007199254740992 then
      redis.call('SET', fk, prev, 'KEEPTTL')
      return nil, redis.error_reply('reqlock: fence key ' .. fk .. ' does not hold a fence')
    end
  end
  if last + stride <= now then
    return now
  end
  local fence = last + stride
  local keep = tonumber(retention) + math.ceil((fence - now) / 1000)
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

-- refuse_abandoned returns an error reply when the abandon mark am exists:
-- the call is a late copy of an acquisition that the Store undid once its
-- caller had left (its request held up in the network past the undo), and
-- must grant nothing. Else nil.
local function refuse_abandoned(am)
  if redis.call('EXISTS', am) == 1 then
    return redis.error_reply('reqlock: redisstore: a late acquire of a token the Store abandoned')
  end
  return nil
end

-- mark_waiting records, in waiting key wk, that a caller was refused a key
-- whose holder has pttl ms left, so that the key's release publishes: a
-- release deletes wk with the lock and publishes only when wk was there. The
-- mark outlives the holder's TTL by a second, and every refusal renews it;
-- a refused waiter polls again within the holder's TTL.
local function mark_waiting(wk, pttl)
  redis.call('SET', wk, '1', 'PX', math.max(pttl, 0) + 1000)
end
