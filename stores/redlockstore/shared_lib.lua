-- Helpers of shared places and waiting writers, prepended after lib.lua
-- and internal/redislua's writers.lua (see scripts.go).

-- Shared places. A key held shared is a sorted set of its holders' tokens,
-- each scored by the expiry of its place (node ms), beside a hash KEY:places
-- of each holder's attempt and limit ("ATTEMPT:LIMIT"): the plain scripts'
-- GET fails on it (no token owns it) and its PTTL is the latest place's.

-- expire_places keeps lock key k and its places hash until its latest
-- place's expiry; a key with no place left is gone already.
local function expire_places(k)
  local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  if #top == 2 then
    redis.call('PEXPIREAT', k, top[2])
    redis.call('PEXPIREAT', k .. ':places', top[2])
  end
end

-- prune_places drops the places of k that expired before now ms, and
-- publishes a release on k's channel when it dropped one.
local function prune_places(k, now)
  local gone = redis.call('ZRANGEBYSCORE', k, '-inf', '(' .. string.format('%.0f', now))
  if #gone == 0 then
    return
  end
  redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. string.format('%.0f', now))
  redis.call('HDEL', k .. ':places', unpack(gone))
  redis.call('PUBLISH', k, 'released')
end

-- place_of returns the attempt and the limit of token's place on k, a key
-- held shared whose expired places are pruned, or nil.
local function place_of(k, token)
  local v = redis.call('HGET', k .. ':places', token)
  if not v or not redis.call('ZSCORE', k, token) then
    return nil
  end
  local a, l = string.match(v, '^(%d+):(%d+)$')
  return tonumber(a), tonumber(l)
end

-- set_place sets token's place on k until expiry ms, of attempt and limit.
local function set_place(k, token, expiry, attempt, limit)
  redis.call('ZADD', k, string.format('%.0f', expiry), token)
  redis.call('HSET', k .. ':places', token, string.format('%.0f:%.0f', attempt, limit))
  expire_places(k)
end

-- drop_place frees token's place on k and publishes the release.
local function drop_place(k, token)
  redis.call('ZREM', k, token)
  redis.call('HDEL', k .. ':places', token)
  expire_places(k)
  redis.call('PUBLISH', k, 'released')
end

-- writers_of and writer_mark name lock key k's waiting writers and token's
-- writer mark on it (see internal/redislua/writers.lua).
local function writers_of(k)
  return k .. ':writers'
end
local function writer_mark(k, token)
  return k .. ':writer:' .. token
end

-- writer_withdraws ends token's writer record on k, if it has one (a
-- writer that stopped waiting), and publishes a release on k's channel
-- when no other writer's window stands, for the holders it kept out.
local function writer_withdraws(k, token)
  if redis.call('DEL', writer_mark(k, token)) == 0 then
    return
  end
  local ws = writers_of(k)
  redis.call('ZREM', ws, token)
  if writer_window_left(ws, math.floor(now_us() / 1000)) == 0 then
    redis.call('PUBLISH', k, 'released')
  end
end

-- refused_shared marks lock key k refused to a shared caller for wait ms
-- (and a second more), so that a grant that finds k gone once the last
-- place expired signals the refused caller (see expired_shared).
local function refused_shared(k, wait)
  redis.call('SET', k .. ':refused', '1', 'PX', math.max(wait, 0) + 1000)
  return {0, 0, wait, 0, 0}
end

-- expired_shared publishes a release on lock key k's channel, found free,
-- when a shared caller was refused k since (see refused_shared): the
-- places it met expired with the key, which no call saw.
local function expired_shared(k)
  if redis.call('DEL', k .. ':refused') == 1 then
    redis.call('PUBLISH', k, 'released')
  end
end
