-- ack.lua: the consumer trained on its batch: its groups are consumed and their
-- detail deleted. Acknowledging anything but the consumer's current batch is ignored;
-- acknowledging a batch released from its consumer (release.lua) is refused and
-- counted (acks_refused): its groups went back to the ready list for another consumer.
--
-- KEYS[1] = counters hash
-- KEYS[2] = groups hash
-- KEYS[3] = batches hash
-- KEYS[4] = prompts hash
-- KEYS[5] = attempts hash
-- KEYS[6] = results hash
-- KEYS[7] = state hash (version)
-- KEYS[8] = observations stream (metrics)
-- KEYS[9] = released sorted set (batch id -> when it was released)
-- KEYS[10] = history hash (group id -> its story, for `trace`)
-- ARGV[1] = now (seconds)
-- ARGV[2] = consumer id
-- ARGV[3] = batch id
-- Returns {'acked', number of groups} | {'ignored', reason} | {'refused', 'released'}

local counters = KEYS[1]
local now, consumer = tonumber(ARGV[1]), ARGV[2]
local raw = redis.call('HGET', KEYS[3], consumer)
local batch = raw and cjson.decode(raw)
if (not batch or batch.id ~= ARGV[3]) and redis.call('ZSCORE', KEYS[9], ARGV[3]) then
  bump(counters, 'acks_refused', 1)
  return {'refused', 'released'}
end
if not raw then return ignored(counters, 'no batch held') end
if batch.id ~= ARGV[3] then return ignored(counters, 'not the held batch') end

local k = {groups = KEYS[2], prompts = KEYS[4], attempts = KEYS[5], results = KEYS[6],
           history = KEYS[10]}
local version = tonumber(redis.call('HGET', KEYS[7], 'version') or '0')
for _, gid in ipairs(batch.groups) do
  local g = get_json(KEYS[2], gid)
  -- a released group keeps the staleness of its first delivery
  observe(KEYS[8], 'staleness', (g.dv or version) - g.version)
  consume_group(k, now, gid, g, batch.id, consumer)
end
redis.call('HDEL', KEYS[3], consumer)
bump(counters, 'consumed', #batch.groups)
return {'acked', #batch.groups}
