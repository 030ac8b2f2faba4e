-- Helpers prepended to every script (see scripts.go).

-- now_us returns the node's clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- quarantine returns how many more ms the node must stay out of quorums
-- after losing its data. A node without the marker key has lost its data
-- (or is new): it stays out until it has been up for delay ms, and the
-- marker records when that is, for every client of the node. Redis counts
-- uptime_in_seconds as the difference of two clocks truncated to whole
-- seconds, up to 1s more than the node has been up: the node is credited
-- with 1s less, so it never rejoins early (it may stay out up to 1s long).
local function quarantine(marker, nowms, delay)
  local till = redis.call('GET', marker)
  if not till then
    local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')) or 0
    till = nowms + math.max(0, delay - math.max(0, up - 1) * 1000)
    redis.call('SET', marker, string.format('%.0f', till))
  end
  till = tonumber(till)
  if till == nil then
    return delay -- garbage in the marker: stay out; an operator resets it
  end
  return math.max(0, till - nowms)
end

-- fence_keep is how long a fence key lives: the retention, and longer while
-- the fence runs ahead of the clock, so that once the key expires the clock
-- alone exceeds every fence it held.
local function fence_keep(fence, nowus, retention)
  return tonumber(retention) + math.ceil(math.max(0, fence - nowus) / 1000)
end

-- closed reports whether an undo or a release closed the writes of attempt
-- of token on key: they leave a tombstone, KEY:dead:TOKEN, holding the last
-- attempt they closed (a release closes every attempt).
local function closed(key, token, attempt)
  local d = redis.pcall('GET', key .. ':dead:' .. token)
  return type(d) == 'string' and (tonumber(d) or 0) >= tonumber(attempt)
end

-- owner returns the token and the attempt of a lock key's value: a write
-- of attempt A of token T sets the key to T#A. A value of another shape (of
-- another client) is a token of its own, of attempt 0.
local function owner(v)
  if type(v) ~= 'string' then
    return nil, 0
  end
  local t, a = string.match(v, '^(.*)#(%d+)$')
  if t == nil then
    return v, 0
  end
  return t, tonumber(a)
end

-- digest is a number that stands for a holder's token in a refusal.
local function digest(v)
  local t = owner(v)
  if t == nil then
    return 0
  end
  return tonumber(string.sub(redis.sha1hex(t), 1, 12), 16)
end

-- last_fence returns the fence fence key fk holds (nil when absent), or
-- false and an error reply when it holds something else.
local function last_fence(fk)
  local v = redis.call('GET', fk)
  if not v then
    return nil
  end
  local l = tonumber(v)
  if l == nil or l >= 9007199254740992 then
    return false, redis.error_reply('reqlock: fence key ' .. fk .. ' does not hold a fence')
  end
  return l
end

-- issue_fence stores and returns the fence of a grant in fence key fk,
-- which held last (see last_fence): last + stride while fk lives, else the
-- client's proposal clamped to [node clock, node clock + 2s], so that nodes
-- that saw the same grants issue the same fence.
local function issue_fence(fk, last, nowus, proposal, stride, retention)
  local fence = math.max(nowus, math.min(tonumber(proposal), nowus + 2000000))
  if last then
    fence = last + tonumber(stride)
  end
  redis.call('SET', fk, string.format('%.0f', fence), 'PX', fence_keep(fence, nowus, retention))
  return fence
end
