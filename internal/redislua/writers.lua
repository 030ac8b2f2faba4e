-- Waiting writers of a key held shared (stores.SharedStore's writer
-- preference), as redisstore and redlockstore keep them on a Redis node.
-- Prepended after the package's lib.lua, whose now_us they use.
--
-- ws is the key's writers: a sorted set of tokens scored by the end of each
-- one's window (server ms); wm is a token's writer mark, which stands while
-- the token has a record in ws, so that a grant or a release finds the
-- record with one EXISTS, GET or DEL.

-- writer_waits records token as a writer waiting for the shared holders of
-- a key to drain, in ws and in its mark wm, both kept for window ms, the
-- newest record's window being the longest.
local function writer_waits(ws, wm, token, window)
  local now = math.floor(now_us() / 1000)
  redis.call('ZADD', ws, string.format('%.0f', now + window), token)
  redis.call('PEXPIRE', ws, window)
  redis.call('SET', wm, '1', 'PX', window)
end

-- writer_granted ends token's writer record, if it has one: its exclusive
-- grant ended its wait.
local function writer_granted(ws, wm, token)
  if redis.call('DEL', wm) == 1 then
    redis.call('ZREM', ws, token)
  end
end

-- writer_window_left returns the ms left of the longest window among the
-- writers of ws at server time now ms, 0 when none stands (ws is then
-- deleted): while it is positive, new shared holders stay out.
local function writer_window_left(ws, now)
  local top = redis.call('ZRANGE', ws, -1, -1, 'WITHSCORES')
  if #top == 2 then
    local left = tonumber(top[2]) - now
    if left > 0 then
      return left
    end
    redis.call('DEL', ws) -- every writer's window has passed
  end
  return 0
end
