-- Resets the TTL of several keys, all or none.
-- KEYS[1..n] lock keys (one slot); ARGV[1] token, ARGV[2] ttl ms.
-- Returns 0 when every key held the token and had its TTL reset, else the
-- index (1-based) of the first key that did not, having changed nothing.
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return i
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 0
