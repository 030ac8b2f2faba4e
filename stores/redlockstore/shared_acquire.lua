-- One node's part of an AcquireShared: makes the token one of the key's
-- holders (see shared_lib.lua).
-- KEYS[1] lock key, KEYS[2] its fence key, KEYS[3] the node marker.
-- ARGV[1..7] as in acquire.lua (token, ttl ms, fence retention ms, fence
-- stride, quarantine ms, first fence proposed, attempt), ARGV[8] the limit
-- (0: any number).
-- Returns as acquire.lua does: {1, fence} when granted; {0, 0, wait ms, 0,
-- 0} when refused, the wait being the exclusive holder's pttl, the longest
-- window left among the waiting writers, or the soonest expiry among the
-- holders of a key that has limit holders or more; {-1, ms left} while
-- quarantined; {-2} for a closed or earlier attempt (a late call). A
-- refusal marks the key (see refused_shared), so that a place freed by
-- expiry is signalled too.
-- A token that holds a place is granted again (a retry), whatever the count
-- and the writers; a grant records the call's attempt and limit in the
-- place, so that the undo of an earlier attempt leaves it, and the refresh
-- knows the quorum it needs.
local k, token, attempt, limit = KEYS[1], ARGV[1], tonumber(ARGV[7]), tonumber(ARGV[8])
local nowus = now_us()
local now = math.floor(nowus / 1000)
local wait = quarantine(KEYS[3], now, tonumber(ARGV[5]))
if wait > 0 then
  return {-1, wait}
end
if closed(k, token, ARGV[7]) then
  return {-2}
end
local kind = redis.call('TYPE', k).ok
if kind ~= 'none' and kind ~= 'zset' then
  return refused_shared(k, redis.call('PTTL', k)) -- held exclusively
end
local retry = false
if kind == 'zset' then
  prune_places(k, now)
  local a = place_of(k, token)
  if a then
    if a > attempt then
      return {-2}
    end
    retry = true
  end
end
if not retry then
  local left = writer_window_left(writers_of(k), now)
  if left > 0 then
    return refused_shared(k, left)
  end
  if limit > 0 and redis.call('ZCARD', k) >= limit then
    local soonest = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
    return refused_shared(k, tonumber(soonest[2]) - now)
  end
end
local last, err = last_fence(KEYS[2])
if last == false then
  return err
end
if kind == 'none' then
  expired_shared(k)
end
set_place(k, token, now + tonumber(ARGV[2]), attempt, limit)
return {1, issue_fence(KEYS[2], last, nowus, ARGV[6], ARGV[4], ARGV[3])}
