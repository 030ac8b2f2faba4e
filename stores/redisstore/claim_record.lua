-- KEYS as acquire.lua: [1] lock key (the record key), [2] fence key, [3]
-- waiting key, [4] the token's abandon mark, [5] its writer mark, [6] the
-- key's writers; all in one slot.
-- ARGV as acquire.lua: [1] token, [2] ttl ms, [3] fence retention ms, [4]
-- fence stride, [5] writer window ms; then [6] the prefix of every record
-- value (see record.go).
-- Returns acquire.lua's replies ({1, fence} when claimed, {0, pttl, shared}
-- when refused), except when the key holds a finished record: then the
-- record's value, a string, and nothing changes. A claim is a plain grant
-- of the key (its value the token), so Release and Refresh act on it; a
-- record is a value no token equals, so they never do.
local abandoned, writer = check_marks(KEYS[4], KEYS[5])
if abandoned then
  return abandoned
end
local granted, cur = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]), nil
if not granted then
  granted, cur = own_retry(KEYS[1], ARGV[1], ARGV[2])
  if not granted and type(cur) == 'string' and string.sub(cur, 1, #ARGV[6]) == ARGV[6] then
    return cur
  end
end
if granted then
  local fence, err = issue_fence(KEYS[2], now_us(), ARGV[3], tonumber(ARGV[4]))
  if err then
    redis.call('DEL', KEYS[1])
    return err
  end
  if writer then
    writer_granted(KEYS[6], KEYS[5], ARGV[1])
  end
  return {1, fence}
end
local pttl = redis.call('PTTL', KEYS[1])
local shared = 0
if held_shared(KEYS[1], cur) then
  writer_waits(KEYS[6], KEYS[5], ARGV[1], tonumber(ARGV[5]))
  shared = 1
end
mark_waiting(KEYS[3], pttl)
return {0, pttl, shared}
