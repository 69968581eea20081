-- pop_batch.lua: hand a consumer exactly B ready groups as one batch. A consumer that
-- has an unacknowledged batch gets that same batch again (a restarted trainer). Groups
-- released from another consumer's batch (release.lua) sit at the head of the ready
-- list: the batch that takes them is marked redelivered and keeps the policy version
-- of their first delivery.
--
-- KEYS[1] = counters hash
-- KEYS[2] = state hash (version, last_batch_at, the pause flag and its times)
-- KEYS[3] = groups hash
-- KEYS[4] = ready list of group ids
-- KEYS[5] = batches hash (consumer -> unacknowledged batch JSON)
-- KEYS[6] = observations stream (metrics)
-- KEYS[7] = history hash (group id -> its story, for `trace`)
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
local version = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
local first = nil  -- released groups: the version of their first delivery
for _, gid in ipairs(gids) do
  local g = get_json(KEYS[3], gid)
  g.state = 'delivered'
  g.delivered_at = now
  put_json(KEYS[3], gid, g)
  if g.dv ~= nil and (first == nil or g.dv < first) then first = g.dv end
end
local fields = {id = ARGV[4], consumer = consumer, groups = gids,
  version = first or version, delivered_at = now}
if first ~= nil then fields.redelivered = true end
local batch = cjson.encode(fields)
for _, gid in ipairs(gids) do
  history_add(KEYS[7], gid, {e = 'delivered', t = now, b = ARGV[4], c = consumer,
    v = fields.version, re = fields.redelivered})
end
redis.call('HSET', KEYS[5], consumer, batch)
bump(KEYS[1], 'batches', 1)
local last, paused, paused_at, resumed_at = unpack(redis.call('HMGET', KEYS[2],
  'last_batch_at', 'paused', 'paused_at', 'resumed_at'))
if last then
  last = tonumber(last)
  observe(KEYS[6], 'batch_interval_s', now - last)
  -- the rollout interval leaves the training pause out: from the later of the last
  -- batch and the last resume, to now or to the pause the farm sits in
  local from, to = last, now
  if resumed_at and tonumber(resumed_at) > from then from = tonumber(resumed_at) end
  if paused == '1' and paused_at and tonumber(paused_at) > from then to = tonumber(paused_at) end
  observe(KEYS[6], 'rollout_interval_s', to - from)
end
redis.call('HSET', KEYS[2], 'last_batch_at', now)
return {'delivered', batch}
