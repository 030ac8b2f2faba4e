-- KEYS[1..n] lock keys, KEYS[n+1] the node marker.
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] 1 to re-take keys that are absent,
-- ARGV[4] quarantine ms after a data loss, ARGV[5] the attempt (see closed
-- in lib.lua), ARGV[6] 1 to renew the token's shared place (see
-- shared_lib.lua; one key, never re-taken): it answers {0, the place's
-- limit} when renewed, {2} when the token holds no place.
-- Returns {0} when every key holds the token with its TTL reset (absent keys
-- re-taken when ARGV[3] is 1), each now of the later of its attempt and this
-- one (see owner in lib.lua: the refreshed keys belong to the lock, not to
-- the undo of an earlier attempt); {1, index (1-based)} when a key holds another
-- token; {2} when some key is absent and ARGV[3] is 0; {3} when a release
-- (or an undo) of the token closed its writes; {-1, ms left} while the node
-- is quarantined. Only {0} changes anything.
local n = #KEYS - 1
local wait = quarantine(KEYS[#KEYS], math.floor(now_us() / 1000), tonumber(ARGV[4]))
if wait > 0 then
  return {-1, wait}
end
if ARGV[6] == '1' then
  if closed(KEYS[1], ARGV[1], ARGV[5]) then
    return {3}
  end
  if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then
    return {2}
  end
  local now = math.floor(now_us() / 1000)
  prune_places(KEYS[1], now)
  local a, l = place_of(KEYS[1], ARGV[1])
  if not a then
    return {2}
  end
  set_place(KEYS[1], ARGV[1], now + tonumber(ARGV[2]), math.max(a, tonumber(ARGV[5])), l)
  return {0, l}
end
local absent = false
local values = {}
for i = 1, n do
  if closed(KEYS[i], ARGV[1], ARGV[5]) then
    return {3}
  end
  local v = redis.pcall('GET', KEYS[i])
  values[i] = ARGV[1] .. '#' .. ARGV[5]
  if v == false then
    absent = true
  else
    local t, a = owner(v)
    if t ~= ARGV[1] then
      return {1, i}
    end
    if a > tonumber(ARGV[5]) then
      values[i] = v
    end
  end
end
if absent and ARGV[3] ~= '1' then
  return {2}
end
for i = 1, n do
  redis.call('SET', KEYS[i], values[i], 'PX', ARGV[2])
end
return {0}
