-- Releases several keys at once.
-- KEYS[1..n] lock keys, KEYS[n+1..2n] their waiting keys (KEYS[n+i] belongs
-- to KEYS[i]); all in one slot. ARGV[1] token, ARGV[2] keep ms (0: delete).
-- Each lock key that holds the token is deleted, with its waiting key, and
-- the release is published on the channel named after it when a caller was
-- refused the key meanwhile (see release.lua); with keep > 0 its TTL is set
-- to keep ms instead, and nothing is published (it stays held).
-- Returns {1 or 0 per key}: 1 when the key held the token.
local n = #KEYS / 2
local keep = tonumber(ARGV[2])
local reply = {}
for i = 1, n do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    reply[i] = 1
    if keep > 0 then
      redis.call('PEXPIRE', KEYS[i], keep)
    elseif redis.call('DEL', KEYS[i], KEYS[n + i]) == 2 then
      redis.call('PUBLISH', KEYS[i], 'released')
    end
  else
    reply[i] = 0
  end
end
return reply
