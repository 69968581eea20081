-- start.lua: a worker claims a queued attempt before it sends anything to its replica.
-- Only one claim can win, so an RQ job run twice starts the episode once.
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = leases sorted set (attempt id -> lease expiry)
-- KEYS[4] = prompts hash (group id -> prompt JSON)
-- KEYS[5] = state hash (version, paused)
-- KEYS[6] = replica free slots sorted set (placement)
-- KEYS[7] = replica load hash (placement)
-- KEYS[8] = placed sorted set (placement)
-- ARGV[1] = now (seconds)
-- ARGV[2] = attempt id
-- ARGV[3] = worker id
-- ARGV[4] = replica (engine URL or name)
-- ARGV[5] = replica boot id
-- ARGV[6] = lease length (seconds)
-- ARGV[7] = this call's id (fresh per call, the same when the call is sent again;
--          '' when calls are not resent: nothing is kept)
-- ARGV[8] = lease holder: the worker process whose lease the attempt's follows while
--          it reports nothing new (progress.lua, expire.lua); '' for none
-- Returns {'started', gid, member, attempt number, prompt JSON or '', policy version}
--       | {'ignored', reason}
-- (the prompt and the version come along so the worker needs no more round trips)
-- The call sent again after it was applied (its answer lost, or a replica short when
-- the farm waits for replicas) answers 'started' again, with the version it started
-- under, and changes nothing; any other second start of a running attempt is refused.

local counters = KEYS[1]
local now, aid = tonumber(ARGV[1]), ARGV[2]
local a = get_json(KEYS[2], aid)
if not a then return ignored(counters, 'unknown attempt') end
if a.state == 'running' and a.worker == ARGV[3] and a.boot == ARGV[5] then
  if a.call == ARGV[7] then
    return {'started', a.g, a.m, a.n, redis.call('HGET', KEYS[4], a.g) or '', a.v}
  end
  return ignored(counters, 'duplicate start')
end
-- Only an episode's current attempt can be queued: retry.lua ends the old attempt
-- (stopped or lost) before it creates the new one.
if a.state ~= 'queued' then return ignored(counters, 'attempt is ' .. a.state) end

if a.pl then  -- placement: the load leaves the queue it waited on for this worker
  local r = {free = KEYS[6], load = KEYS[7], placed = KEYS[8]}
  if a.p == ARGV[3] then  -- started where it was placed: the load stays there
    redis.call('ZREM', r.placed, aid)
    a.p = nil
  else
    unplace(r, aid, a)
    replica_load(r, ARGV[3], 1)
  end
end
a.state = 'running'
a.worker, a.replica, a.boot = ARGV[3], ARGV[4], ARGV[5]
a.started_at = now
a.lease = now + tonumber(ARGV[6])
a.seq = 0
a.tokens = 0
if ARGV[7] ~= '' then a.call = ARGV[7] end
if (ARGV[8] or '') ~= '' then a.h = ARGV[8] end
a.v = tonumber(redis.call('HGET', KEYS[5], 'version') or '0')
put_json(KEYS[2], aid, a)
redis.call('ZADD', KEYS[3], a.lease, aid)
bump(counters, 'running', 1)
return {'started', a.g, a.m, a.n, redis.call('HGET', KEYS[4], a.g) or '', a.v}
