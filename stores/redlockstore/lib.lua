-- Helpers prepended to the scripts that grant (see withLib in scripts.go).

-- now_us returns the node's clock in microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- quarantine returns how many more ms the node must stay out of quorums
-- after losing its data. A node without the marker key has lost its data
-- (or is new): it stays out until it has been up for delay ms, and the
-- marker records when that is, for every client of the node.
local function quarantine(marker, nowms, delay)
  local till = redis.call('GET', marker)
  if not till then
    local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')) or 0
    till = nowms + math.max(0, delay - up * 1000)
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
