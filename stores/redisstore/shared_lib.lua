-- Helpers of the shared scripts, prepended after lib.lua (see withSharedLib
-- in shared.go).
--
-- A key held shared is a sorted set of its holders' tokens, each scored by
-- its expiry (server ms), under the lock key itself: so Acquire's SET NX
-- finds it held, its GET fails (another type than a string: no token holds
-- it), and its PTTL, which expire_holders keeps at the latest expiry, is the
-- longest remaining TTL among the holders. Each holder's place ends at its
-- own score: every shared call first drops the places whose score has
-- passed (prune_holders), and when the last one passes, the key expires.

-- fmt formats a whole number of milliseconds for Redis (not 1.7e+12).
local function fmt(ms)
  return string.format('%.0f', ms)
end

-- expire_holders sets the TTL of holders key k to its latest holder's
-- expiry; a key with no holder left is gone already (Redis deletes an empty
-- sorted set).
local function expire_holders(k)
  local top = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
  if #top == 2 then
    redis.call('PEXPIREAT', k, fmt(tonumber(top[2])))
  end
end

-- signal_freed publishes a freed place on lock key k's channel, as a release
-- does, when a caller was refused the key meanwhile (waiting key wk), and
-- consumes that mark: a waiter refused again marks it again.
local function signal_freed(k, wk)
  if redis.call('DEL', wk) == 1 then
    redis.call('PUBLISH', k, 'released')
  end
end

-- prune_holders drops the places of holders key k whose expiry is before
-- now ms, signals them freed (see signal_freed) and returns how many it
-- dropped. A place whose expiry is now still holds, as a key whose
-- PEXPIREAT is now does.
local function prune_holders(k, wk, now)
  local n = redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. fmt(now))
  if n > 0 then
    signal_freed(k, wk)
  end
  return n
end

-- holders_type returns the TYPE of lock key k: 'zset' when shared holders
-- hold it, 'none' when free, else (a string) held exclusively or another
-- program's data.
local function holders_type(k)
  return redis.call('TYPE', k).ok
end

-- own_place drops the expired places of lock key k (see prune_holders) and
-- returns the server time in ms when token holds a place among its holders,
-- else nil: ReleaseShared and RefreshShared act on that place alone.
local function own_place(k, wk, token)
  if holders_type(k) ~= 'zset' then
    return nil
  end
  local now = math.floor(now_us() / 1000)
  prune_holders(k, wk, now)
  if not redis.call('ZSCORE', k, token) then
    return nil
  end
  return now
end
