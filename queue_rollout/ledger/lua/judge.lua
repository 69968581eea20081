-- judge.lua: accept or reject a complete group, and acknowledge and delete the events
-- stream entry that announced it in the same step (a restarted collector judges nothing
-- twice). Accepted groups join the ready queue and keep their staleness budget;
-- rejected groups give it back and their detail is deleted.
--
-- KEYS[1] = counters hash
-- KEYS[2] = groups hash
-- KEYS[3] = ready list of group ids
-- KEYS[4] = events stream
-- KEYS[5] = prompts hash
-- KEYS[6] = attempts hash
-- KEYS[7] = results hash
-- KEYS[8] = history hash (group id -> its story, for `trace`)
-- ARGV[1] = now (seconds)
-- ARGV[2] = group id
-- ARGV[3] = verdict: "accept" or "reject"
-- ARGV[4] = rejection reason (zero_variance, failed_members, plugin); "" to accept
-- ARGV[5] = events consumer group name
-- ARGV[6] = events entry id to acknowledge and delete, or ""
-- ARGV[7] = why it was rejected, in words (kept in the group's story only), or ""
-- Returns {'accepted', ''} | {'rejected', reason} | {'ignored', reason}

local counters = KEYS[1]
local now, gid, verdict = tonumber(ARGV[1]), ARGV[2], ARGV[3]
if verdict ~= 'accept' and verdict ~= 'reject' then
  return redis.error_reply('judge: verdict must be accept or reject, got ' .. verdict)
end
if ARGV[6] ~= '' then  -- acknowledged and deleted: the stream holds unjudged completions
  redis.call('XACK', KEYS[4], ARGV[5], ARGV[6])
  redis.call('XDEL', KEYS[4], ARGV[6])
end
local g = get_json(KEYS[2], gid)
if not g then return ignored(counters, 'unknown group') end
if g.state ~= 'complete' then return ignored(counters, 'group is ' .. g.state) end

history_add(KEYS[8], gid, {e = 'judged', t = now, ok = verdict == 'accept',
  reason = verdict == 'reject' and ARGV[4] or nil,
  why = verdict == 'reject' and ARGV[7] ~= '' and ARGV[7] or nil})
record_verdict(counters, KEYS[2], KEYS[3], now, gid, g, verdict == 'accept', ARGV[4])
if verdict == 'accept' then
  return {'accepted', ''}
end
bump(counters, 'rejected', 1)
bump(counters, 'rejected:' .. ARGV[4], 1)
purge_group({prompts = KEYS[5], attempts = KEYS[6], results = KEYS[7]}, g)
return {'rejected', ARGV[4]}
