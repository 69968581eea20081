-- progress.lua: heartbeat and progress of running attempts: renews each one's lease and
-- records its tokens so far. A worker process renews all of its attempts in one call.
-- Each report carries a sequence number; a report not newer than the attempt's last
-- one is a duplicate and changes nothing. A report from a doubtful attempt proves it
-- still runs: it is running again (doubt resolved, no retry).
-- A process that names itself as their lease holder renews its own lease here, once;
-- an attempt it reports unchanged, and which still runs, then costs at most one small
-- write: its lease in the sorted set, every other renewal (when less than two thirds
-- of a lease is left), its record untouched. Should such renewals stop, its lease
-- follows the holder's while that lives (expire.lua). A changed report is recorded.
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = leases sorted set
-- KEYS[4] = doubt sorted set (attempt id -> doubtful since)
-- KEYS[5] = history hash (group id -> its story, for `trace`: a doubt resolved here)
-- KEYS[6] = holders sorted set (lease holder -> lease expiry)
-- ARGV[1] = now (seconds)
-- ARGV[2] = worker id
-- ARGV[3] = lease length (seconds)
-- ARGV[4] = lease holder: the reporting process ('' for none: each attempt renewed)
-- ARGV[5 + 6i] .. ARGV[10 + 6i] = for i = 0, 1, ...: attempt id, its sequence number
--            (> 0, increasing per attempt), its output tokens so far, the rid of its
--            request in flight ('' while that is the attempt id), '1' while it waits
--            on a tool (the slot held, nothing generating) else '0', '1' when the
--            tokens, rid or tool wait differ from the holder's last report else '0'
-- Returns {status_0, reason_0, status_1, reason_1, ...}, one pair per attempt:
--         'ok' | 'revived' (with '') | 'ignored' with the reason

local counters, attempts, leases, doubt = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, worker, lease, holder = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
if holder ~= '' then redis.call('ZADD', KEYS[6], now + lease, holder) end

local function renew(aid, seq, tokens, rid, tool, changed)
  -- still running (in the leases set, not in doubt) and nothing new
  local expiry = holder ~= '' and changed == '0' and redis.call('ZSCORE', leases, aid)
  if expiry then
    if tonumber(expiry) < now + 2 * lease / 3 then
      redis.call('ZADD', leases, now + lease, aid)
    end
    return {'ok', ''}
  end
  local a = get_json(attempts, aid)
  if not a then return ignored(counters, 'unknown attempt') end
  if a.state ~= 'running' and a.state ~= 'doubtful' then
    return ignored(counters, ended_reason(a))
  end
  if a.worker ~= worker then return ignored(counters, 'wrong worker') end
  if seq <= a.seq then return ignored(counters, 'duplicate progress') end
  local waited = a.state == 'running' and a.tool  -- counted in tool_wait before
  local status = 'ok'
  if a.state == 'doubtful' then
    leave_live_state(counters, leases, doubt, aid, a)
    a.state = 'running'
    a.doubt_at = nil
    a.cause = nil
    bump(counters, 'running', 1)
    status = 'revived'
    history_add(KEYS[5], a.g, {e = 'revived', t = now, a = aid, m = a.m, n = a.n})
  end
  a.seq = seq
  a.tokens = tokens
  if rid ~= '' then a.rid = rid end
  if tool == '1' then a.tool = true else a.tool = nil end
  if a.tool and not waited then bump(counters, 'tool_wait', 1) end
  if waited and not a.tool then bump(counters, 'tool_wait', -1) end
  a.lease = now + lease
  if holder ~= '' then a.h = holder end
  put_json(attempts, aid, a)
  redis.call('ZADD', leases, a.lease, aid)
  return {status, ''}
end

local out = {}
for i = 5, #ARGV, 6 do
  local answer = renew(ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3],
                       ARGV[i + 4], ARGV[i + 5])
  out[#out + 1] = answer[1]
  out[#out + 1] = answer[2]
end
return out
