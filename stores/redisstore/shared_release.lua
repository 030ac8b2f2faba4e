-- One ReleaseShared: ends the token's place among the key's holders.
-- KEYS[1] lock key, KEYS[2] waiting key (same slot); ARGV[1] token, ARGV[2]
-- keep ms (0: free the place now).
-- Returns 1 when the token held the key, else 0, having changed nothing
-- but the places that had expired. A freed place is published on the lock
-- key's channel when a caller was refused the key (see signal_freed); with
-- keep > 0 the place is held until keep ms from now instead.
local now = own_place(KEYS[1], KEYS[2], ARGV[1])
if not now then
  return 0
end
local keep = tonumber(ARGV[2])
if keep > 0 then
  redis.call('ZADD', KEYS[1], fmt(now + keep), ARGV[1])
  expire_holders(KEYS[1])
  return 1
end
redis.call('ZREM', KEYS[1], ARGV[1])
expire_holders(KEYS[1])
signal_freed(KEYS[1], KEYS[2])
return 1
