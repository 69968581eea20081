-- admit.lua: admit the next pending prompt as a group of G episodes, if the pause
-- flag, the staleness budget and the slot capacity all allow it. A whole group must
-- fit. The G first attempts are created queued, their slots reserved, and their ids
-- handed to the outbox in the same step, so a crash loses nothing between reserving
-- and enqueueing. A farm that places groups puts the G attempts on the replica with
-- the most free slots when it has G, else on as few replicas as possible (those with
-- the most free slots first); with too few free slots in all, the group waits.
--
-- KEYS[1] = counters hash
-- KEYS[2] = state hash (version, paused, budget_baseline)
-- KEYS[3] = pending list of prompt ids
-- KEYS[4] = groups hash
-- KEYS[5] = attempts hash
-- KEYS[6] = outbox list of attempt ids waiting for their RQ job
-- KEYS[7] = replica free slots sorted set (worker id -> slots - load)
-- KEYS[8] = replica load hash (worker id -> attempts placed on it or run by it)
-- KEYS[9] = placed sorted set (queued attempt id -> placed at)
-- ARGV[1] = now (seconds)
-- ARGV[2] = group size G
-- ARGV[3] = batch size B
-- ARGV[4] = capacity in episode slots (group mode: max_concurrent_rollouts * G)
-- ARGV[5] = max_staleness
-- ARGV[6] = mode: "group" or "sample"
-- ARGV[7] = placement: "any" (any worker takes any attempt) or "group"
-- ARGV[8 .. 7+G] = the G new attempt ids, one per member
-- Returns {'admitted', gid, aid0, ..., aidG-1[, worker0, ..., workerG-1 when placed]}
--       | {'blocked', 'paused'|'staleness'|'capacity'|'placement'} | {'empty', ''}

local counters, state = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local G, B = tonumber(ARGV[2]), tonumber(ARGV[3])
local capacity, max_staleness = tonumber(ARGV[4]), tonumber(ARGV[5])
local mode, placement = ARGV[6], ARGV[7]
local first_aid = 8

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
-- where each member goes: targets[m + 1] = worker id
local targets = {}
if placement == 'group' then
  local top = redis.call('ZREVRANGE', KEYS[7], 0, G - 1, 'WITHSCORES')
  for i = 1, #top, 2 do
    local free = tonumber(top[i + 1])
    while free >= 1 and #targets < G do
      targets[#targets + 1] = top[i]
      free = free - 1
    end
  end
  if #targets < G then
    bump(counters, 'blocked:placement', 1)
    return {'blocked', 'placement'}
  end
end

-- Every check before the first write: Redis does not undo a script's writes when it
-- returns an error.
local gid = redis.call('LINDEX', KEYS[3], 0)
if redis.call('HEXISTS', KEYS[4], gid) == 1 then
  return redis.error_reply('admit: group ' .. gid .. ' already exists')
end
for m = 0, G - 1 do
  if redis.call('HEXISTS', KEYS[5], ARGV[first_aid + m]) == 1 then
    return redis.error_reply('admit: attempt id ' .. ARGV[first_aid + m] .. ' already exists')
  end
end
redis.call('LPOP', KEYS[3])
local aids = {}
local placed = {}  -- ZADD arguments: now, aid, now, aid, ...
for m = 0, G - 1 do
  local aid = ARGV[first_aid + m]
  local a = {g = gid, m = m, n = 1, stops = 0, state = 'queued', created_at = now}
  if placement == 'group' then
    a.pl, a.p = true, targets[m + 1]
    placed[2 * m + 1], placed[2 * m + 2] = now, aid
  end
  put_json(KEYS[5], aid, a)
  aids[m + 1] = aid
end
if placement == 'group' then
  -- targets are grouped by replica (each takes a run of members): one update each
  local r, first = {load = KEYS[8], free = KEYS[7]}, 1
  for m = 2, G + 1 do
    if m > G or targets[m] ~= targets[first] then
      replica_load(r, targets[first], m - first)
      first = m
    end
  end
  redis.call('ZADD', KEYS[9], unpack(placed))
  bump(counters, targets[1] == targets[G] and 'placements:one_replica' or 'placements:split', 1)
end
put_json(KEYS[4], gid, {id = gid, G = G, mode = mode, state = 'in_flight', done = 0,
  failed = 0, version = version, admitted_at = now, aids = table.concat(aids, ',')})
redis.call('RPUSH', KEYS[6], unpack(aids))
bump(counters, 'reserved', G)
bump(counters, 'in_flight', 1)
bump(counters, 'admitted', 1)
if placement == 'group' then
  for m = 1, G do aids[G + m] = targets[m] end
end
return {'admitted', gid, unpack(aids)}
