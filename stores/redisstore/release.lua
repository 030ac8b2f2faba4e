-- KEYS[1] lock key, KEYS[2] waiting key, KEYS[3] the token's writer mark,
-- KEYS[4] the key's writers (same slot); ARGV[1] token.
-- Returns 1 when released, 0 when not held. When a caller was refused the
-- key while it was held (the waiting key is there), the release is
-- published on the channel named after the lock key, so that waiters wake
-- without polling; otherwise nobody waits, and nothing is published.
-- A token that does not hold the key withdraws its writer record, if it
-- has one (see writer_withdraws): a writer that stopped waiting.
-- A key of another type than a string (another program's data, or shared
-- holders) makes GET fail; redis.pcall turns the failure into an error
-- table, which equals no token, so such a key is not held and is left as
-- it is.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  writer_withdraws(KEYS[1], KEYS[4], KEYS[3], KEYS[2], ARGV[1])
  return 0
end
if redis.call('DEL', KEYS[1], KEYS[2]) == 2 then
  redis.call('PUBLISH', KEYS[1], 'released')
end
return 1
