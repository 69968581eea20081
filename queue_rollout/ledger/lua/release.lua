-- release.lua: a consumer's unacknowledged batch goes back whole to the head of the
-- ready groups (its consumer is gone, or kept it past timeouts.batch_ack), so the next
-- pop_batch of any consumer delivers it again, marked redelivered. Its groups keep the
-- policy version of their first delivery (dv); its batch id is remembered, so that a
-- late ack of it from the consumer it was taken from is refused.
--
-- KEYS[1] = counters hash
-- KEYS[2] = groups hash
-- KEYS[3] = ready list of group ids
-- KEYS[4] = batches hash (consumer -> unacknowledged batch JSON)
-- KEYS[5] = released sorted set (batch id -> when it was released)
-- ARGV[1] = now (seconds)
-- ARGV[2] = consumer id
-- ARGV[3] = batch id: release only that batch ('': whichever the consumer holds)
-- ARGV[4] = released batch ids kept (the oldest beyond are forgotten)
-- Returns {'released', batch JSON} | {'empty', ''}

local now, consumer, only = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local raw = redis.call('HGET', KEYS[4], consumer)
if not raw then return {'empty', ''} end
local batch = cjson.decode(raw)
if only ~= '' and batch.id ~= only then return {'empty', ''} end

for i = #batch.groups, 1, -1 do  -- pushed from the last, so they keep their order
  local gid = batch.groups[i]
  local g = get_json(KEYS[2], gid)
  if g and g.state == 'delivered' then
    g.state = 'accepted'
    if g.dv == nil then g.dv = batch.version end
    g.released = (g.released or 0) + 1
    g.released_at = now
    put_json(KEYS[2], gid, g)
    redis.call('LPUSH', KEYS[3], gid)
  end
end
redis.call('HDEL', KEYS[4], consumer)
redis.call('ZADD', KEYS[5], now, batch.id)
redis.call('ZREMRANGEBYRANK', KEYS[5], 0, -(tonumber(ARGV[4]) + 1))
bump(KEYS[1], 'released', 1)
return {'released', raw}
