-- admit.lua: admit the next pending prompt as a group of G episodes, if the pause
-- flag, the staleness budget and the slot capacity all allow it. A whole group must
-- fit. The G first attempts are created queued, their slots reserved, and their ids
-- handed to the outbox in the same step, so a crash loses nothing between reserving
-- and enqueueing.
--
-- KEYS[1] = counters hash
-- KEYS[2] = state hash (version, paused, budget_baseline)
-- KEYS[3] = pending list of prompt ids
-- KEYS[4] = groups hash
-- KEYS[5] = attempts hash
-- KEYS[6] = outbox list of attempt ids waiting for their RQ job
-- ARGV[1] = now (seconds)
-- ARGV[2] = group size G
-- ARGV[3] = batch size B
-- ARGV[4] = capacity in episode slots (group mode: max_concurrent_rollouts * G)
-- ARGV[5] = max_staleness
-- ARGV[6] = mode: "group" or "sample"
-- ARGV[7 .. 6+G] = the G new attempt ids, one per member
-- Returns {'admitted', gid, aid0, ..., aidG-1} | {'blocked', 'paused'|'staleness'|'capacity'}
--       | {'empty', ''}

local counters, state = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local G, B = tonumber(ARGV[2]), tonumber(ARGV[3])
local capacity, max_staleness = tonumber(ARGV[4]), tonumber(ARGV[5])
local mode = ARGV[6]

if redis.call('HGET', state, 'paused') == '1' then
  bump(counters, 'blocked:paused', 1)
  return {'blocked', 'paused'}
end
if redis.call('LLEN', KEYS[3]) == 0 then
  return {'empty', ''}
end
local st = redis.call('HMGET', state, 'version', 'budget_baseline')
local version, baseline = tonumber(st[1] or '0'), tonumber(st[2] or '0')
local in_flight = counter(counters, 'in_flight')
-- accepted counts from the baseline set_version keeps (set_version.lua says why)
if counter(counters, 'accepted') - baseline + in_flight + 1
    > (max_staleness + version + 1) * B then
  bump(counters, 'blocked:staleness', 1)
  return {'blocked', 'staleness'}
end
if counter(counters, 'reserved') + G > capacity then
  bump(counters, 'blocked:capacity', 1)
  return {'blocked', 'capacity'}
end

-- Every check before the first write: Redis does not undo a script's writes when it
-- returns an error.
local gid = redis.call('LINDEX', KEYS[3], 0)
if redis.call('HEXISTS', KEYS[4], gid) == 1 then
  return redis.error_reply('admit: group ' .. gid .. ' already exists')
end
for m = 0, G - 1 do
  if redis.call('HEXISTS', KEYS[5], ARGV[7 + m]) == 1 then
    return redis.error_reply('admit: attempt id ' .. ARGV[7 + m] .. ' already exists')
  end
end
redis.call('LPOP', KEYS[3])
local aids = {}
for m = 0, G - 1 do
  local aid = ARGV[7 + m]
  put_json(KEYS[5], aid, {g = gid, m = m, n = 1, stops = 0, state = 'queued', created_at = now})
  aids[m + 1] = aid
end
put_json(KEYS[4], gid, {id = gid, G = G, mode = mode, state = 'in_flight', done = 0,
  failed = 0, version = version, admitted_at = now, aids = table.concat(aids, ',')})
redis.call('RPUSH', KEYS[6], unpack(aids))
bump(counters, 'reserved', G)
bump(counters, 'in_flight', 1)
bump(counters, 'admitted', 1)
return {'admitted', gid, unpack(aids)}
