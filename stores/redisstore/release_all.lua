-- Releases several keys at once.
-- KEYS[1..n] lock keys, KEYS[n+1..2n] their waiting keys, KEYS[2n+1..3n] the
-- token's writer marks on them, KEYS[3n+1..4n] their writers (KEYS[n+i],
-- KEYS[2n+i] and KEYS[3n+i] belong to KEYS[i]); all in one slot. ARGV[1]
-- token, ARGV[2] keep ms (0: delete).
-- Each lock key that holds the token is deleted, with its waiting key, and
-- the release is published on the channel named after it when a caller was
-- refused the key meanwhile (see release.lua); with keep > 0 its TTL is set
-- to keep ms instead, and nothing is published (it stays held). On each key
-- that does not hold the token, the token withdraws its writer record, if
-- it has one (see writer_withdraws).
-- Returns {1 or 0 per key}: 1 when the key held the token.
local n = #KEYS / 4
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
    writer_withdraws(KEYS[i], KEYS[3 * n + i], KEYS[2 * n + i], KEYS[n + i], ARGV[1])
    reply[i] = 0
  end
end
return reply
