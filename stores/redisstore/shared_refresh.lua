-- One RefreshShared: renews the token's place among the key's holders.
-- KEYS[1] lock key, KEYS[2] waiting key (same slot); ARGV[1] token, ARGV[2]
-- ttl ms.
-- Returns 1 when the token held the key and its place now lasts ttl ms
-- from now, else 0, having changed nothing but the places that had expired.
local now = own_place(KEYS[1], KEYS[2], ARGV[1])
if not now then
  return 0
end
redis.call('ZADD', KEYS[1], fmt(now + tonumber(ARGV[2])), ARGV[1])
expire_holders(KEYS[1])
return 1
