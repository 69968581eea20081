-- doubt.lua: a running attempt may have stopped or may still run (lease expired, RQ
-- job lost, /generate timed out). It keeps its slot and no retry starts until the
-- doubt is resolved: a late result (finish.lua), a report (progress.lua), a confirmed
-- stop or the doubt timeout (retry.lua).
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = episodes hash
-- KEYS[4] = leases sorted set
-- KEYS[5] = doubt sorted set (attempt id -> doubtful since)
-- ARGV[1] = now (seconds)
-- ARGV[2] = attempt id
-- ARGV[3] = cause (lease_expired, worker_lost, generate_error, ...)
-- Returns {'doubtful', ''} | {'ignored', reason}

local counters = KEYS[1]
local now, aid = tonumber(ARGV[1]), ARGV[2]
local a = get_json(KEYS[2], aid)
if not a then return ignored(counters, 'unknown attempt') end
local e = get_json(KEYS[3], episode_field(a.g, a.m))
if not e or e.aid ~= aid then return ignored(counters, 'superseded attempt') end
if a.state ~= 'running' then return ignored(counters, 'attempt is ' .. a.state) end

leave_live_state(counters, KEYS[4], KEYS[5], aid, a)
a.state = 'doubtful'
a.doubt_at = now
a.cause = ARGV[3]
put_json(KEYS[2], aid, a)
redis.call('ZADD', KEYS[5], now, aid)
bump(counters, 'doubtful', 1)
bump(counters, 'doubts:' .. ARGV[3], 1)
return {'doubtful', ''}
