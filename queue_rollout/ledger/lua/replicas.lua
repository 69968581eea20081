-- replicas.lua: set the workers admission may place groups on, with their slots. A
-- worker with slots > 0 enters (or stays with new slots) with free = slots - load; one
-- with 0 leaves: nothing more is placed on it (what waits on its queue is moved by the
-- reconciler). The load of each worker is kept either way: it follows the attempts.
--
-- KEYS[1] = replica slots hash (worker id -> slots)
-- KEYS[2] = replica free slots sorted set
-- KEYS[3] = replica load hash
-- ARGV[1] = now (seconds)
-- ARGV[2 ..] = pairs: worker id, slots (0: it leaves)
-- Returns {'set', number of workers placeable}

for i = 2, #ARGV - 1, 2 do
  local worker, slots = ARGV[i], tonumber(ARGV[i + 1])
  if slots > 0 then
    redis.call('HSET', KEYS[1], worker, slots)
    local load = tonumber(redis.call('HGET', KEYS[3], worker) or '0')
    redis.call('ZADD', KEYS[2], slots - load, worker)
  else
    redis.call('HDEL', KEYS[1], worker)
    redis.call('ZREM', KEYS[2], worker)
  end
end
return {'set', redis.call('HLEN', KEYS[1])}
