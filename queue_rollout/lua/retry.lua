-- retry.lua: an attempt is over without a result, either confirmed stopped (boot id
-- changed, abort-then-probe, the worker itself stopped it) or declared lost after the
-- doubt timeout. The episode gets a new attempt (same member, so the same seed) that
-- inherits the slot without releasing it; after max_attempts ended attempts the
-- episode fails instead.
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = episodes hash
-- KEYS[4] = groups hash
-- KEYS[5] = outbox list
-- KEYS[6] = leases sorted set
-- KEYS[7] = doubt sorted set
-- KEYS[8] = events stream
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
local e = get_json(KEYS[3], episode_field(a.g, a.m))
if not e or e.aid ~= aid then return ignored(counters, 'superseded attempt') end
if e.state ~= 'active' then return ignored(counters, 'episode is ' .. e.state) end
if resolution == 'lost' then
  if a.state ~= 'doubtful' then return ignored(counters, 'attempt is ' .. a.state) end
  if now - a.doubt_at < tonumber(ARGV[7]) then return ignored(counters, 'doubt too recent') end
elseif resolution == 'stopped' then
  if a.state ~= 'running' and a.state ~= 'doubtful' then
    return ignored(counters, 'attempt is ' .. a.state)
  end
else
  return redis.error_reply('retry: resolution must be stopped or lost, got ' .. resolution)
end

leave_live_state(counters, KEYS[6], KEYS[7], aid, a)
a.state = resolution
a.ended_at = now
a.cause = ARGV[5]
put_json(KEYS[2], aid, a)
e.stops = e.stops + 1

if e.stops >= tonumber(ARGV[6]) then
  local g = get_json(KEYS[4], a.g)
  local k = {counters = counters, episodes = KEYS[3], groups = KEYS[4], events = KEYS[8]}
  if episode_terminal(k, now, g, e, 'failed') then return {'failed', 'group_complete'} end
  return {'failed', ''}
end
if redis.call('HEXISTS', KEYS[2], new_aid) == 1 then
  return redis.error_reply('retry: attempt id ' .. new_aid .. ' already exists')
end
bump(counters, 'retries:' .. ARGV[5], 1)
e.n = e.n + 1
e.aid = new_aid
e.aids = e.aids .. ',' .. new_aid
put_json(KEYS[3], episode_field(a.g, a.m), e)
put_json(KEYS[2], new_aid, {g = a.g, m = a.m, n = e.n, state = 'queued', created_at = now})
redis.call('RPUSH', KEYS[5], new_aid)
return {'retried', new_aid}
