-- lead.lua: collector leadership. The holder renews its lease; anyone may take a
-- lease that has expired. One leader at a time admits, judges and reconciles.
--
-- KEYS[1] = leader hash (holder, expires)
-- ARGV[1] = now (seconds)
-- ARGV[2] = candidate name
-- ARGV[3] = lease length (seconds)
-- Returns {'leader', candidate} | {'follower', current holder}

local now, candidate = tonumber(ARGV[1]), ARGV[2]
local holder = redis.call('HGET', KEYS[1], 'holder')
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires') or '0')
if holder and holder ~= candidate and now < expires then
  return {'follower', holder}
end
redis.call('HSET', KEYS[1], 'holder', candidate, 'expires', now + tonumber(ARGV[3]))
return {'leader', candidate}
