-- progress.lua: heartbeat and progress of a running attempt: renews its lease and
-- records tokens so far. Each report carries a sequence number; a report not newer
-- than the last one is a duplicate and changes nothing. A report from a doubtful
-- attempt proves it still runs: it is running again (doubt resolved, no retry).
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = leases sorted set
-- KEYS[4] = doubt sorted set (attempt id -> doubtful since)
-- ARGV[1] = now (seconds)
-- ARGV[2] = attempt id
-- ARGV[3] = worker id
-- ARGV[4] = sequence number (> 0, increasing per attempt)
-- ARGV[5] = lease length (seconds)
-- ARGV[6] = output tokens so far
-- Returns {'ok', ''} | {'revived', ''} | {'ignored', reason}

local counters = KEYS[1]
local now, aid = tonumber(ARGV[1]), ARGV[2]
local seq = tonumber(ARGV[4])
local a = get_json(KEYS[2], aid)
if not a then return ignored(counters, 'unknown attempt') end
if a.state ~= 'running' and a.state ~= 'doubtful' then
  return ignored(counters, ended_reason(a))
end
if a.worker ~= ARGV[3] then return ignored(counters, 'wrong worker') end
if seq <= a.seq then return ignored(counters, 'duplicate progress') end

local status = 'ok'
if a.state == 'doubtful' then
  leave_live_state(counters, KEYS[3], KEYS[4], aid, a)
  a.state = 'running'
  a.doubt_at = nil
  a.cause = nil
  bump(counters, 'running', 1)
  status = 'revived'
end
a.seq = seq
a.tokens = tonumber(ARGV[6])
a.lease = now + tonumber(ARGV[5])
put_json(KEYS[2], aid, a)
redis.call('ZADD', KEYS[3], a.lease, aid)
return {status, ''}
