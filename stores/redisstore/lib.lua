-- Helpers prepended to every script that issues fences or refuses a waiter
-- (see withLib in redisstore.go), so that one definition serves them all.
-- Each script gets those it calls: each is a top-level "local function"
-- that ends with a line "end", its comment right above it.

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
-- TTL to ttl ms, as a fresh grant would; else false and what GET answered
-- (see held_shared). A key of another type than a string does not hold the
-- token.
local function own_retry(k, token, ttl)
  local cur = redis.pcall('GET', k)
  if cur == token then
    redis.call('PEXPIRE', k, ttl)
    return true, cur
  end
  return false, cur
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

-- check_marks returns an error reply when the token's abandon mark am
-- exists (see refuse_abandoned), else nil and whether its writer mark wm
-- exists (see writer_waits): one EXISTS of both, so that an acquire of a
-- token that neither was abandoned nor waits as a writer pays nothing more
-- than refuse_abandoned did.
local function check_marks(am, wm)
  if redis.call('EXISTS', am, wm) == 0 then
    return nil, false
  end
  local abandoned = refuse_abandoned(am)
  if abandoned then
    return abandoned, false
  end
  return nil, true
end

-- held_shared reports whether lock key k, whose GET answered cur, is held
-- by shared holders: such a key is a sorted set (see shared_lib.lua), so
-- GET failed on it, and only then is its TYPE read.
local function held_shared(k, cur)
  return type(cur) == 'table' and redis.call('TYPE', k).ok == 'zset'
end

-- writer_withdraws ends token's writer record, if it has one, on the
-- release by a token that does not hold lock key k: the writer stopped
-- waiting. When no other writer's window stands, the key's waiters (readers
-- the writers kept out) are signalled, if any was refused (waiting key wk).
local function writer_withdraws(k, ws, wm, wk, token)
  if redis.call('DEL', wm) == 0 then
    return
  end
  redis.call('ZREM', ws, token)
  local now = math.floor(now_us() / 1000)
  if redis.call('ZCOUNT', ws, string.format('(%.0f', now), '+inf') == 0 and redis.call('DEL', wk) == 1 then
    redis.call('PUBLISH', k, 'released')
  end
end
