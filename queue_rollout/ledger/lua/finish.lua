-- finish.lua: the result of an attempt. Recorded once per episode: a duplicate, a
-- wrong attempt id, a member index that does not match, or a result from a superseded
-- attempt is ignored and changes no counter. A late result from a doubtful attempt
-- counts (once). Sample mode releases the slot now; group mode when the group
-- completes; a completed group goes on the events stream.
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = groups hash
-- KEYS[4] = results hash (gid/member -> encoded result)
-- KEYS[5] = leases sorted set
-- KEYS[6] = doubt sorted set
-- KEYS[7] = events stream (group completions)
-- KEYS[8] = observations stream (metrics)
-- KEYS[9] = shape parts hash (gid/member -> a finished member's shape, JSON)
-- KEYS[10] = shapes list (completed groups' shapes, newest first, capped)
-- KEYS[11] = replica free slots sorted set (placement)
-- KEYS[12] = replica load hash (placement)
-- KEYS[13] = history hash (group id -> its story, for `trace`)
-- ARGV[1] = now (seconds)
-- ARGV[2] = attempt id
-- ARGV[3] = member index the worker ran
-- ARGV[4] = outcome: "finished" or "failed"
-- ARGV[5] = output tokens produced
-- ARGV[6] = encoded result (opaque bytes)
-- ARGV[7] = why a failed episode failed (counted as failed:<reason>): "workflow"
--           (the workflow rejected its output or raised), "oversized" (the result
--           was over limits.max_result_bytes); ignored for "finished"
-- ARGV[8] = context tokens the replica computed (prefill), over the episode's calls
-- ARGV[9] = context tokens it found in its prefix cache
-- ARGV[10] = this call's id (fresh per call, the same when the call is sent again;
--           '' when calls are not resent: nothing is kept)
-- ARGV[11] = the episode's turns: its requests to the replica, one per turn
-- ARGV[12] = the seconds of each of its tool waits, comma-separated ('' for none)
-- ARGV[13] = the member's shape, a JSON object ('' for none: the group is not kept)
-- ARGV[14] = how many group shapes the shapes list keeps
-- Returns {'recorded', 'group_complete' | ''} | {'ignored', reason}
-- The call sent again after it was applied (its answer lost, or a replica short when
-- the farm waits for replicas) answers what it answered then and changes nothing.

local counters = KEYS[1]
local now, aid = tonumber(ARGV[1]), ARGV[2]
local outcome = ARGV[4]
if outcome ~= 'finished' and outcome ~= 'failed' then
  return redis.error_reply('finish: outcome must be finished or failed, got ' .. outcome)
end
local a = get_json(KEYS[2], aid)
if not a then return ignored(counters, 'unknown attempt') end
if tonumber(ARGV[3]) ~= a.m then return ignored(counters, 'member mismatch') end
if a.state == 'finished' or a.state == 'failed' then
  if a.call == ARGV[10] then return {'recorded', a.completed and 'group_complete' or ''} end
  return ignored(counters, 'duplicate result')
end
if a.state ~= 'running' and a.state ~= 'doubtful' then
  return ignored(counters, ended_reason(a))
end
local g = get_json(KEYS[3], a.g)
-- the group's story: the attempt, from its start (a late result ends a doubt)
history_add(KEYS[13], a.g, {e = 'finished', t = now, a = aid, m = a.m, n = a.n, s = outcome,
  w = a.worker, r = a.replica, st = a.started_at, v = a.v,
  why = outcome == 'failed' and ARGV[7] or nil, late = a.state == 'doubtful' or nil})

leave_live_state(counters, KEYS[5], KEYS[6], aid, a)
if a.pl then replica_load({free = KEYS[11], load = KEYS[12]}, a.worker, -1) end
a.state = outcome
a.ended_at = now
if ARGV[10] ~= '' then a.call = ARGV[10] end
redis.call('HSET', KEYS[4], episode_field(a.g, a.m), ARGV[6])
bump(counters, 'output_tokens', tonumber(ARGV[5]))
if tonumber(ARGV[8]) > 0 then bump(counters, 'prefill:computed', tonumber(ARGV[8])) end
if tonumber(ARGV[9]) > 0 then bump(counters, 'prefill:cached', tonumber(ARGV[9])) end
bump(counters, 'turns', tonumber(ARGV[11]))
for seconds in string.gmatch(ARGV[12], '[^,]+') do observe(KEYS[8], 'tool_s', seconds) end
if outcome == 'failed' then bump(counters, 'failed:' .. ARGV[7], 1) end
if a.started_at then observe(KEYS[8], 'episode_s', now - a.started_at) end
if outcome == 'finished' and ARGV[13] ~= '' then
  redis.call('HSET', KEYS[9], episode_field(a.g, a.m), ARGV[13])
end
local k = {counters = counters, groups = KEYS[3], events = KEYS[7]}
if episode_terminal(k, now, g, outcome) then
  a.completed = true
  -- the group's shape, when every member left one: {"group_id", "members": [...]}
  local fields = {}
  for m = 0, g.G - 1 do fields[m + 1] = episode_field(g.id, m) end
  local parts = redis.call('HMGET', KEYS[9], unpack(fields))
  redis.call('HDEL', KEYS[9], unpack(fields))
  local whole = true
  for m = 1, g.G do if not parts[m] then whole = false end end
  if whole then
    redis.call('LPUSH', KEYS[10], '{"group_id":' .. cjson.encode(g.id) .. ',"members":['
               .. table.concat(parts, ',') .. ']}')
    redis.call('LTRIM', KEYS[10], 0, tonumber(ARGV[14]) - 1)
  end
end
put_json(KEYS[2], aid, a)
return {'recorded', a.completed and 'group_complete' or ''}
