-- retry.lua: an attempt is over without a result, either confirmed stopped (boot id
-- changed, abort-then-probe, the worker itself stopped it) or declared lost after the
-- doubt timeout. The member gets a new attempt (same member, so the same seed) that
-- inherits the slot without releasing it; after max_attempts ended attempts the
-- episode fails instead. In a farm that places groups, the new attempt is placed on
-- the replica the old one ran on (its group's prompt is cached there) when that
-- replica has a free slot, else it goes to the shared queue.
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = groups hash
-- KEYS[4] = outbox list ('aid@worker', 'aid@': the queue its job goes to)
-- KEYS[5] = leases sorted set
-- KEYS[6] = doubt sorted set
-- KEYS[7] = events stream
-- KEYS[8] = replica free slots sorted set (placement)
-- KEYS[9] = replica load hash (placement)
-- KEYS[10] = placed sorted set (placement)
-- KEYS[11] = history hash (group id -> its story, for `trace`)
-- ARGV[1] = now (seconds)
-- ARGV[2] = attempt id
-- ARGV[3] = new attempt id
-- ARGV[4] = resolution: "stopped" (confirmed) or "lost" (doubt timed out)
-- ARGV[5] = cause (lease_expired, worker_lost, replica_restart, generate_error, doubt_timeout)
-- ARGV[6] = max_attempts
-- ARGV[7] = doubt timeout (seconds): "lost" needs doubt for at least this long
-- Returns {'retried', new aid} | {'failed', 'group_complete' | ''} | {'ignored', reason}

local counters = KEYS[1]
local now, aid, new_aid = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local resolution = ARGV[4]
local a = get_json(KEYS[2], aid)
if not a then return ignored(counters, 'unknown attempt') end
if resolution == 'lost' then
  if a.state ~= 'doubtful' then return ignored(counters, ended_reason(a)) end
  if now - a.doubt_at < tonumber(ARGV[7]) then return ignored(counters, 'doubt too recent') end
elseif resolution == 'stopped' then
  if a.state ~= 'running' and a.state ~= 'doubtful' then
    return ignored(counters, ended_reason(a))
  end
else
  return redis.error_reply('retry: resolution must be stopped or lost, got ' .. resolution)
end
-- (checked before any write: Redis does not undo a script's writes on an error)
if redis.call('HEXISTS', KEYS[2], new_aid) == 1 then
  return redis.error_reply('retry: attempt id ' .. new_aid .. ' already exists')
end

-- the group's story: the attempt, from its start, and how it ended (next: the new
-- attempt, none when the episode fails)
local story = {e = 'retried', t = now, a = aid, m = a.m, n = a.n, res = resolution,
  c = ARGV[5], w = a.worker, r = a.replica, st = a.started_at, v = a.v, ds = a.doubt_at}
leave_live_state(counters, KEYS[5], KEYS[6], aid, a)
local r = {free = KEYS[8], load = KEYS[9], placed = KEYS[10]}
if a.pl then replica_load(r, a.worker, -1) end
local stops = a.stops + 1
local give_up = stops >= tonumber(ARGV[6])
-- The last attempt of an episode that fails stays its current attempt, state failed;
-- how it ended is kept in `resolution`.
a.state = give_up and 'failed' or resolution
a.resolution = resolution
a.ended_at = now
a.cause = ARGV[5]
put_json(KEYS[2], aid, a)
local g = get_json(KEYS[3], a.g)
if not give_up then story.next = new_aid end
history_add(KEYS[11], a.g, story)
if give_up then
  local k = {counters = counters, groups = KEYS[3], events = KEYS[7]}
  bump(counters, 'failed:max_attempts', 1)
  if episode_terminal(k, now, g, 'failed') then return {'failed', 'group_complete'} end
  return {'failed', ''}
end
local new = {g = a.g, m = a.m, n = a.n + 1, stops = stops, state = 'queued', created_at = now}
if a.pl then
  new.pl = true
  local free = redis.call('ZSCORE', r.free, a.worker)
  if free and tonumber(free) >= 1 then
    new.p = a.worker
    replica_load(r, a.worker, 1)
    redis.call('ZADD', r.placed, now, new_aid)
  end
end
put_json(KEYS[2], new_aid, new)
g.aids = g.aids .. ',' .. new_aid
put_json(KEYS[3], a.g, g)
redis.call('RPUSH', KEYS[4], outbox_entry(new_aid, new))
bump(counters, 'retries:' .. ARGV[5], 1)
return {'retried', new_aid}
