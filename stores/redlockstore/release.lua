-- KEYS[1..n] lock keys; ARGV[1] token, ARGV[2] keep ms (0: delete), ARGV[3]
-- 1 to publish each deleted key's release on the channel named like it.
-- Returns, per key, 1 when it held the token (and was released), else 0.
-- A key of another type than a string does not hold the token.
local reply = {}
for i = 1, #KEYS do
  reply[i] = 0
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    reply[i] = 1
    if tonumber(ARGV[2]) > 0 then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
    else
      redis.call('DEL', KEYS[i])
      if ARGV[3] == '1' then
        redis.call('PUBLISH', KEYS[i], 'released')
      end
    end
  end
end
return reply
