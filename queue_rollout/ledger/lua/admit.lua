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
-- KEYS[6] = outbox list of attempts waiting for their RQ job ('aid@worker', 'aid@')
-- KEYS[7] = replica free slots sorted set (worker id -> slots - load)
-- KEYS[8] = replica load hash (worker id -> attempts placed on it or run by it)
-- KEYS[9] = placed sorted set (queued attempt id -> placed at)
-- KEYS[10] = recent refusals hash (reason -> JSON [10-second bucket, its count and the
--            5 before it's, oldest first]: the refusals of about the last minute)
-- KEYS[11] = history hash (group id -> its story: events, one JSON object a line)
-- KEYS[12] = history index sorted set (group id -> admitted at)
-- ARGV[1] = now (seconds)
-- ARGV[2] = group size G
-- ARGV[3] = batch size B
-- ARGV[4] = capacity in episode slots (group mode: max_concurrent_rollouts * G)
-- ARGV[5] = max_staleness
-- ARGV[6] = mode: "group" or "sample"
-- ARGV[7] = placement: "any" (any worker takes any attempt) or "group"
-- ARGV[8] = history: the groups whose story is kept (0: none)
-- ARGV[9] = history: seconds a group's story is kept after its admission
-- ARGV[10 .. 9+G] = the G new attempt ids, one per member
-- ARGV[10+G] = on a farm of several cells, the group the control Redis reserved for
--              this cell (reserve.lua), which must be the next pending one; '' or
--              absent: the next pending group, the pause and the budget checked here
-- ARGV[11+G] = the reserved group's policy version (what reserve.lua answered)
-- Returns {'admitted', gid, aid0, ..., aidG-1[, worker0, ..., workerG-1 when placed]}
--       | {'already', gid, aid0, ..., aidG-1} (the reserved group was admitted before)
--       | {'blocked', 'paused'|'staleness'|'capacity'|'placement'} | {'empty', ''}

local counters, state = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local G, B = tonumber(ARGV[2]), tonumber(ARGV[3])
local capacity, max_staleness = tonumber(ARGV[4]), tonumber(ARGV[5])
local mode, placement = ARGV[6], ARGV[7]
local history_kept, history_s = tonumber(ARGV[8]), tonumber(ARGV[9])
local first_aid = 10
local reserved = ARGV[first_aid + G] or ''
local HISTORY_DROPS = 8

local function refuse(reason)
  return refuse_admission(counters, KEYS[10], now, reason)
end

local version
if reserved ~= '' then
  -- the pause and the budget were the control Redis's to decide
  local g = get_json(KEYS[4], reserved)
  if g then
    local out = {'already', reserved}
    for aid in string.gmatch(g.aids, '[^,]+') do out[#out + 1] = aid end
    return out
  end
  if redis.call('LINDEX', KEYS[3], 0) ~= reserved then
    return redis.error_reply('admit: reserved group ' .. reserved .. ' is not the next pending')
  end
  version = tonumber(ARGV[first_aid + G + 1])
  if not version then
    return redis.error_reply('admit: reserved group ' .. reserved .. ' comes without its version')
  end
else
  if redis.call('HGET', state, 'paused') == '1' then
    return refuse('paused')
  end
  if redis.call('LLEN', KEYS[3]) == 0 then
    return {'empty', ''}
  end
  local over
  over, version = over_budget(counters, state, B, max_staleness)
  if over then
    return refuse('staleness')
  end
end
if counter(counters, 'reserved') + G > capacity then
  return refuse('capacity')
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
    return refuse('placement')
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
local aids, entries = {}, {}  -- attempt ids; their outbox entries
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
  entries[m + 1] = outbox_entry(aid, a)
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
redis.call('RPUSH', KEYS[6], unpack(entries))
bump(counters, 'reserved', G)
bump(counters, 'in_flight', 1)
bump(counters, 'admitted', 1)
if history_kept > 0 then
  -- the group's story begins; the oldest stories leave: those admitted history_s ago
  -- or more, then those beyond the cap, at most HISTORY_DROPS of each per admission
  -- (so a lowered cap is reached within a few admissions)
  local history, index = KEYS[11], KEYS[12]
  redis.call('HSET', history, gid,
             cjson.encode({e = 'admitted', t = now, v = version, G = G, mode = mode}))
  redis.call('ZADD', index, now, gid)
  local drop = redis.call('ZRANGEBYSCORE', index, '-inf', now - history_s,
                          'LIMIT', 0, HISTORY_DROPS)
  local over = math.min(redis.call('ZCARD', index) - #drop - history_kept, HISTORY_DROPS)
  if over > 0 then
    for _, old in ipairs(redis.call('ZRANGE', index, #drop, #drop + over - 1)) do
      drop[#drop + 1] = old
    end
  end
  if #drop > 0 then
    redis.call('ZREM', index, unpack(drop))
    redis.call('HDEL', history, unpack(drop))
  end
  -- both go with the last admission's stories when the farm admits no more
  redis.call('EXPIRE', history, history_s)
  redis.call('EXPIRE', index, history_s)
end
if placement == 'group' then
  for m = 1, G do aids[G + m] = targets[m] end
end
return {'admitted', gid, unpack(aids)}
