-- KEYS[1..n] lock keys; ARGV[1] token, ARGV[2] keep ms (0: delete), ARGV[3]
-- 1 to publish each deleted key's release on the channel named like it,
-- ARGV[4] the attempt to close (0: none), ARGV[5] the tombstone's TTL ms,
-- ARGV[6] the last attempt released: a key written by a later attempt of
-- the token (see owner in lib.lua) is not released, ARGV[7] 1 to release
-- the token's shared place (see shared_lib.lua) rather than a plain lock.
-- Returns, per key, 1 when it held the token (and was released), else 0.
-- A plain release finds no token in a key of another type than a string,
-- and then withdraws the token's writer record on the key, if it has one
-- (see writer_withdraws); a shared release finds only places.
-- Closing an attempt leaves a tombstone, KEY:dead:TOKEN, holding the last
-- attempt closed, which the acquire and refresh scripts of that attempt and
-- earlier ones obey: a call that arrives after its undo or release writes
-- nothing.
local reply = {}
local close = tonumber(ARGV[4])
local upto = tonumber(ARGV[6])
for i = 1, #KEYS do
  if close > 0 then
    local dead = KEYS[i] .. ':dead:' .. ARGV[1]
    local last = redis.pcall('GET', dead)
    local c = close
    if type(last) == 'string' and (tonumber(last) or 0) > c then
      c = tonumber(last)
    end
    local px = math.max(tonumber(ARGV[5]), redis.call('PTTL', dead))
    redis.call('SET', dead, string.format('%.0f', c), 'PX', px)
  end
  reply[i] = 0
  if ARGV[7] == '1' then
    if redis.call('TYPE', KEYS[i]).ok == 'zset' then
      local now = math.floor(now_us() / 1000)
      prune_places(KEYS[i], now)
      local a, l = place_of(KEYS[i], ARGV[1])
      if a and a <= upto then
        reply[i] = 1
        if tonumber(ARGV[2]) > 0 then
          set_place(KEYS[i], ARGV[1], now + tonumber(ARGV[2]), a, l)
        else
          drop_place(KEYS[i], ARGV[1])
        end
      end
    end
  else
    local t, a = owner(redis.pcall('GET', KEYS[i]))
    if t ~= ARGV[1] then
      writer_withdraws(KEYS[i], ARGV[1])
    elseif a <= upto then
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
end
return reply
