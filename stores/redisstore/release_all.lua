-- Ends a grant on several keys, or on one with a positive keep.
-- KEYS[1..n] lock keys (one slot); ARGV[1] token, ARGV[2] keep ms (0: delete).
-- Each lock key that holds the token is deleted, with a release published on
-- its channel as in release.lua, or, when keep is positive, left to expire
-- after keep ms without a publish (it stays held). Returns {1 or 0 per key}:
-- 1 when the key held the token, 0 when it did not (it is then left as it
-- was). A key of another type than a string (another program's data) makes
-- GET fail; redis.pcall turns the failure into an error table, which equals
-- no token, so such a key is not held and the other keys are still released.
local keep = tonumber(ARGV[2])
local reply = {}
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    reply[i] = 1
    if keep > 0 then
      redis.call('PEXPIRE', KEYS[i], keep)
    else
      redis.call('DEL', KEYS[i])
      redis.call('PUBLISH', KEYS[i], 'released')
    end
  else
    reply[i] = 0
  end
end
return reply
