-- The grant of acquire.lua and claim_record.lua: a helper of withLib (see
-- redisstore.go) parsed after the waiting writers' of internal/redislua,
-- which it calls, as lib.lua's helpers are parsed before them.

-- acquire_key runs acquire.lua's grant on its keys and argv (see there):
-- it grants lock key keys[1] to token argv[1] with a fence and returns {1,
-- fence}, or refuses and returns {0, pttl, shared}. With record_prefix
-- (claim_record.lua), a key held by a value that starts with it is a
-- finished record: its value is returned, and nothing changes.
local function acquire_key(keys, argv, record_prefix)
  local abandoned, writer = check_marks(keys[4], keys[5])
  if abandoned then
    return abandoned
  end
  local granted, cur = redis.call('SET', keys[1], argv[1], 'NX', 'PX', argv[2]), nil
  if not granted then
    granted, cur = own_retry(keys[1], argv[1], argv[2])
    if record_prefix and not granted and type(cur) == 'string' and string.sub(cur, 1, #record_prefix) == record_prefix then
      return cur
    end
  end
  if granted then
    local fence, err = issue_fence(keys[2], now_us(), argv[3], tonumber(argv[4]))
    if err then
      redis.call('DEL', keys[1])
      return err
    end
    if writer then
      writer_granted(keys[6], keys[5], argv[1])
    end
    return {1, fence}
  end
  local pttl = redis.call('PTTL', keys[1])
  local shared = 0
  if held_shared(keys[1], cur) then
    writer_waits(keys[6], keys[5], argv[1], tonumber(argv[5]))
    shared = 1
  end
  mark_waiting(keys[3], pttl)
  return {0, pttl, shared}
end
