-- Ends a grant on several keys; also ReleaseKeep's script, with one key.
-- KEYS[1..n] lock keys, KEYS[n+1..2n] their fence keys (KEYS[n+i] is the
-- fence key of KEYS[i]); all in one slot.
-- ARGV[1] token, ARGV[2] keep ms (0: delete), ARGV[3] fence retention ms,
-- ARGV[3+i] highest fence used under the grant of KEYS[i] (0: only the
-- grant's own).
-- Each lock key that holds the token is deleted, with a release published on
-- its channel as in release.lua, or, when keep is positive, left to expire
-- after keep ms without a publish (it stays held). Its fence key is raised
-- as in release.lua. Returns {1 or 0 per key}: 1 when the key held the
-- token, 0 when it did not (it is then left as it was).
-- Every key is read before any is written, so no write fails half-way. A
-- key of another type than a string (another program's data) makes GET
-- fail; redis.pcall turns the failure into an error table, which equals no
-- token. A lock key of another type is therefore not held, and neither is
-- one whose fence key is of another type (its fence could not be recorded):
-- that key gets 0 and is left as it was, and the other keys are still
-- released.
local n = #KEYS / 2
local keep = tonumber(ARGV[2])
local reply = {}
for i = 1, n do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] and type(redis.pcall('GET', KEYS[n + i])) ~= 'table' then
    reply[i] = 1
  else
    reply[i] = 0
  end
end
for i = 1, n do
  if reply[i] == 1 then
    record_fence(KEYS[n + i], ARGV[3 + i], ARGV[3])
    if keep > 0 then
      redis.call('PEXPIRE', KEYS[i], keep)
    else
      redis.call('DEL', KEYS[i])
      redis.call('PUBLISH', KEYS[i], 'released')
    end
  end
end
return reply
