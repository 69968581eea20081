-- pop_batch.lua: hand a consumer exactly B ready groups as one batch. A consumer that
-- has an unacknowledged batch gets that same batch again (a restarted trainer).
--
-- KEYS[1] = counters hash
-- KEYS[2] = state hash (version)
-- KEYS[3] = groups hash
-- KEYS[4] = ready list of group ids
-- KEYS[5] = batches hash (consumer -> unacknowledged batch JSON)
-- KEYS[6] = observations stream (metrics)
-- ARGV[1] = now (seconds)
-- ARGV[2] = consumer id
-- ARGV[3] = batch size B
-- ARGV[4] = new batch id
-- Returns {'delivered', batch JSON} | {'redelivered', batch JSON} | {'empty', ''}

local now, consumer, B = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local held = redis.call('HGET', KEYS[5], consumer)
if held then return {'redelivered', held} end
if redis.call('LLEN', KEYS[4]) < B then return {'empty', ''} end

local gids = redis.call('LPOP', KEYS[4], B)
for _, gid in ipairs(gids) do
  local g = get_json(KEYS[3], gid)
  g.state = 'delivered'
  g.delivered_at = now
  put_json(KEYS[3], gid, g)
end
local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
local batch = cjson.encode({id = ARGV[4], consumer = consumer, groups = gids,
  version = version, delivered_at = now})
redis.call('HSET', KEYS[5], consumer, batch)
bump(KEYS[1], 'batches', 1)
local last = redis.call('HGET', KEYS[2], 'last_batch_at')
if last then observe(KEYS[6], 'batch_interval_s', now - tonumber(last)) end
redis.call('HSET', KEYS[2], 'last_batch_at', now)
return {'delivered', batch}
