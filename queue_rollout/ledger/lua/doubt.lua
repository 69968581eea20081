-- doubt.lua: a running attempt may have stopped or may still run (lease expired, RQ
-- job lost, /generate timed out). It keeps its slot and no retry starts until the
-- doubt is resolved: a late result (finish.lua), a report (progress.lua), a confirmed
-- stop or the doubt timeout (retry.lua).
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = leases sorted set
-- KEYS[4] = doubt sorted set (attempt id -> doubtful since)
-- KEYS[5] = history hash (group id -> its story, for `trace`)
-- ARGV[1] = now (seconds)
-- ARGV[2] = attempt id
-- ARGV[3] = cause (lease_expired, worker_lost, generate_error, ...)
-- Returns {'doubtful', ''} | {'ignored', reason}

local counters = KEYS[1]
local now, aid = tonumber(ARGV[1]), ARGV[2]
local a = get_json(KEYS[2], aid)
if not a then return ignored(counters, 'unknown attempt') end
if a.state ~= 'running' then return ignored(counters, ended_reason(a)) end

become_doubtful({counters = counters, attempts = KEYS[2], leases = KEYS[3], doubt = KEYS[4],
                 history = KEYS[5]}, now, aid, a, ARGV[3])
return {'doubtful', ''}
