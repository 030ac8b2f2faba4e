-- Lock key helpers, prepended to every script that reads a lock key (see
-- withLockValueLib in redisstore.go). A lock key holds its owner's token,
-- followed by ':w' once an acquire of another token was refused on it: its
-- release then signals waiters, and a release nobody waited for signals
-- nothing. Tokens contain no ':' (the store refuses others).

-- holds reports whether lock value v (GET's reply; false for a missing key,
-- an error table for a key of another type) is token, and whether it is
-- marked as waited for.
local function holds(v, token)
  if v == token then
    return true, false
  end
  if v == token .. ':w' then
    return true, true
  end
  return false, false
end

-- refused marks lock key k, whose value is v, as waited for, and returns
-- its PTTL. A key of another type than a string (another program's data)
-- is left as it is.
local function refused(k, v)
  if type(v) == 'string' and string.sub(v, -2) ~= ':w' then
    redis.call('APPEND', k, ':w')
  end
  return redis.call('PTTL', k)
end
