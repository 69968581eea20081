-- ack.lua: the consumer trained on its batch: its groups are consumed and their
-- detail deleted. Acknowledging anything but the consumer's current batch is ignored.
--
-- KEYS[1] = counters hash
-- KEYS[2] = groups hash
-- KEYS[3] = batches hash
-- KEYS[4] = prompts hash
-- KEYS[5] = attempts hash
-- KEYS[6] = results hash
-- KEYS[7] = state hash (version)
-- KEYS[8] = observations stream (metrics)
-- ARGV[1] = now (seconds)
-- ARGV[2] = consumer id
-- ARGV[3] = batch id
-- Returns {'acked', number of groups} | {'ignored', reason}

local counters = KEYS[1]
local now, consumer = tonumber(ARGV[1]), ARGV[2]
local raw = redis.call('HGET', KEYS[3], consumer)
if not raw then return ignored(counters, 'no batch held') end
local batch = cjson.decode(raw)
if batch.id ~= ARGV[3] then return ignored(counters, 'not the held batch') end

local k = {prompts = KEYS[4], attempts = KEYS[5], results = KEYS[6]}
local version = tonumber(redis.call('HGET', KEYS[7], 'version') or '0')
for _, gid in ipairs(batch.groups) do
  local g = get_json(KEYS[2], gid)
  observe(KEYS[8], 'staleness', version - g.version)
  g.state = 'consumed'
  g.consumed_at = now
  put_json(KEYS[2], gid, g)
  purge_group(k, g)
end
redis.call('HDEL', KEYS[3], consumer)
bump(counters, 'consumed', #batch.groups)
return {'acked', #batch.groups}
