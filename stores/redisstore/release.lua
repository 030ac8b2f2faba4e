-- KEYS[1] lock key; ARGV[1] token.
-- Returns 1 when released, 0 when not held. A release is published on the
-- channel named after the lock key, so that waiters wake without polling.
-- A key of another type than a string (another program's data) makes GET
-- fail; redis.pcall turns the failure into an error table, which equals no
-- token, so such a key is not held and is left as it is.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[1], 'released')
return 1
