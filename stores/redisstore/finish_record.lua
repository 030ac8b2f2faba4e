-- KEYS[1] lock key (the record key), KEYS[2] its waiting key (same slot).
-- ARGV[1] token, ARGV[2] the record's value, which starts with ARGV[3], the
-- value's prefix that names the token that finished it (see record.go),
-- ARGV[4] retention ms.
-- Returns 1 when the token's claim was replaced by the record, 2 when the
-- key already holds the record this token finished (a retry: nothing
-- changes), 0 when the key holds neither (nothing changes). Like a release,
-- it publishes on the channel named after the key when a caller was
-- refused the claim (the waiting key is there), so that waiters claim
-- again and read the record. A key of another type than a string makes GET
-- fail: redis.pcall turns that into an error table, which is neither.
local cur = redis.pcall('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
  if redis.call('DEL', KEYS[2]) == 1 then
    redis.call('PUBLISH', KEYS[1], 'released')
  end
  return 1
end
if type(cur) == 'string' and string.sub(cur, 1, #ARGV[3]) == ARGV[3] then
  return 2
end
return 0
