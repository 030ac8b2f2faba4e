-- KEYS[1] lock key; ARGV[1] token, ARGV[2] ttl ms.
-- Returns 1 when the TTL was reset, 0 when not held (also when the key is of
-- another type than a string: redis.pcall turns GET's failure into an error
-- table, which equals no token).
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
