-- Resets the TTL of several keys, all or none.
-- KEYS[1..n] lock keys (one slot); ARGV[1] token, ARGV[2] ttl ms.
-- Returns 0 when every key held the token and had its TTL reset, else the
-- index (1-based) of the first key that did not, having changed nothing.
-- A key of another type than a string (another program's data) makes GET
-- fail; redis.pcall turns the failure into an error table, which equals no
-- token, so such a key does not hold the token either.
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) ~= ARGV[1] then
    return i
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 0
