-- One attempt of a fair waiter.
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] queue (ZSET: token -> arrival
-- ticket, server microseconds), KEYS[4] leases (ZSET: token -> lease deadline,
-- server milliseconds), KEYS[5] waiting key, KEYS[6] the token's abandon mark
-- (see refuse_abandoned), KEYS[7] its writer mark, KEYS[8] the key's writers
-- (see writer_waits); all eight in one slot.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms, ARGV[4] lease ms
-- (0: try once without joining the queue), ARGV[5] most waiters dropped per call,
-- ARGV[6] fence stride, ARGV[7] writer window ms (stores.WriterWindow).
-- Returns {1, fence} when granted, else {0, hint ms, ahead, shared}: the hint
-- is the holder's PTTL, or, when the key is free but another waiter heads
-- the queue, that waiter's remaining lease (0 when unknown); ahead is the
-- number of waiters queued before the token (-1 when it is not queued);
-- shared is 1 when shared holders hold the key (the token is then recorded
-- as a waiting writer), else 0.
local abandoned, writer = check_marks(KEYS[6], KEYS[7])
if abandoned then
  return abandoned
end
local token = ARGV[1]
local lease = tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(nowus / 1000)

-- A key that already holds the token was set by this same call, run before
-- (the client retried after losing the reply): grant it again, whoever
-- queued meanwhile.
-- grant issues the fence of a grant the call just made, or undoes the grant
-- when the fence key is bad.
local function grant()
  local fence, err = issue_fence(KEYS[2], nowus, ARGV[3], tonumber(ARGV[6]))
  if err then
    redis.call('DEL', KEYS[1])
    return err
  end
  if writer then
    writer_granted(KEYS[8], KEYS[7], token)
  end
  return {1, fence}
end

local retried, cur = own_retry(KEYS[1], token, ARGV[2])
if retried then
  return grant()
end

-- Heartbeat first: a late attempt keeps its place unless it was dropped.
local queued = redis.call('ZSCORE', KEYS[3], token) ~= false
if queued and lease > 0 then
  redis.call('ZADD', KEYS[4], now + lease, token)
end

-- Drop waiters whose lease has passed, the earliest deadlines first.
local dropped = 0
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. now, 'LIMIT', 0, limit)
if #dead > 0 then
  redis.call('ZREM', KEYS[3], unpack(dead))
  redis.call('ZREM', KEYS[4], unpack(dead))
  dropped = #dead
  for _, d in ipairs(dead) do
    if d == token then
      queued = false
    end
  end
end

-- The head is the first queued waiter with a live lease. A queue entry
-- without one (left by a partial expiry) is dropped too.
local head, headDeadline
local empty = false
for _ = 1, limit do
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)
  if #h == 0 then
    empty = true
    break
  end
  if h[1] == token then
    head = token -- its lease was renewed above
    break
  end
  local d = tonumber(redis.call('ZSCORE', KEYS[4], h[1]))
  if d and d >= now then
    head, headDeadline = h[1], d
    break
  end
  redis.call('ZREM', KEYS[3], h[1])
  redis.call('ZREM', KEYS[4], h[1])
  dropped = dropped + 1
end

if (empty or head == token) and redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
  local reply = grant()
  if queued and reply[1] == 1 then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  return reply
end

if lease > 0 then
  if not queued then
    -- Tickets grow within a queue even if the server clock steps back.
    local ticket = nowus
    local tail = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    if #tail == 2 then
      ticket = math.max(ticket, tonumber(tail[2]) + 1)
    end
    redis.call('ZADD', KEYS[3], string.format('%.0f', ticket), token)
    redis.call('ZADD', KEYS[4], now + lease, token)
    queued = true
  end
  -- Abandoned queues expire; a live waiter renews them, and a shorter lease
  -- never cuts the TTL that a waiter with a longer one set.
  local keep = 2 * lease
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < keep then
      redis.call('PEXPIRE', KEYS[i], keep)
    end
  end
end

local ahead = -1
if head == token then
  ahead = 0
elseif queued then
  ahead = redis.call('ZRANK', KEYS[3], token)
end
local pttl = redis.call('PTTL', KEYS[1])
local shared = 0
if pttl ~= -2 and held_shared(KEYS[1], cur) then
  writer_waits(KEYS[8], KEYS[7], token, tonumber(ARGV[7]))
  shared = 1
end
if pttl > 0 or queued then
  -- The release of the key, or of the one the head takes next, publishes.
  mark_waiting(KEYS[5], math.max(pttl, lease))
end
if pttl > 0 then
  return {0, pttl, ahead, shared}
end
if pttl == -2 and dropped > 0 then
  -- The key is free and dead waiters left: wake the new head now.
  redis.call('PUBLISH', KEYS[1], 'dequeued')
end
if head and head ~= token then
  return {0, headDeadline - now, ahead, shared}
end
return {0, 0, ahead, shared}
