-- KEYS[1] lock key, KEYS[2] fence key (same slot)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms
-- Returns {1, fence} when granted, else {0, pttl of the holder}.
-- The fence key is read and checked before anything is written, so a bad
-- fence key fails the call without leaving a lock behind.
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last == nil or last >= 9007199254740992 then
  return redis.error_reply('reqlock: fence key ' .. KEYS[2] .. ' does not hold a fence')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = math.max(last + 1, now)
  -- %.0f, not tostring: tostring prints 1.7e+15.
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
