-- Raises fence keys to at least the fences of a grant.
-- KEYS[1..n] fence keys; ARGV[1..n] their fences, ARGV[n+1] fence retention ms.
-- Returns 1.
local n = #KEYS
local nowus = now_us()
for i = 1, n do
  local l = tonumber(redis.call('GET', KEYS[i]) or '0')
  local f = tonumber(ARGV[i])
  if l == nil then
    return redis.error_reply('reqlock: fence key ' .. KEYS[i] .. ' does not hold a fence')
  end
  if l < f then
    redis.call('SET', KEYS[i], ARGV[i], 'PX', fence_keep(f, nowus, ARGV[n + 1]))
  end
end
return 1
