-- KEYS[1] lock key; ARGV[1] token.
-- Returns 1 when released, 0 when not held. A release of a key marked as
-- waited for (see lockvalue.lua) is published on the channel named after
-- the lock key, so that waiters wake without polling; a release nobody
-- waited for publishes nothing.
-- A key of another type than a string (another program's data) makes GET
-- fail; redis.pcall turns the failure into an error table, which holds no
-- token, so such a key is not held and is left as it is.
local mine, marked = holds(redis.pcall('GET', KEYS[1]), ARGV[1])
if not mine then
  return 0
end
redis.call('DEL', KEYS[1])
if marked then
  redis.call('PUBLISH', KEYS[1], 'released')
end
return 1
