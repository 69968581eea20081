-- settle.lua: on a farm of several cells, the control Redis's half of judging a group
-- its cell completed, before the cell's own judgement (judge.lua there). Accepted, the
-- group joins the farm's ready list (pop_batch.lua takes its batches from there) and
-- its budget stays counted, as accepted; rejected, its budget is given back. The verdict
-- stays on the group's record: settling the group again changes nothing and answers the
-- first verdict, so a collector that crashed between the two halves judges the group
-- in its cell as it was settled here.
--
-- KEYS[1] = counters hash (the farm's: in_flight, accepted)
-- KEYS[2] = groups hash (group id -> the farm's record of it, reserve.lua's)
-- KEYS[3] = ready list of group ids (the farm's)
-- ARGV[1] = now (seconds)
-- ARGV[2] = group id
-- ARGV[3] = verdict: "accept" or "reject"
-- ARGV[4] = rejection reason (zero_variance, failed_members, plugin); "" to accept
-- Returns {'accepted', ''} | {'rejected', reason} (the first verdict, when settled
--         before) | {'ignored', reason}

local counters, groups = KEYS[1], KEYS[2]
local now, gid, verdict = tonumber(ARGV[1]), ARGV[2], ARGV[3]
if verdict ~= 'accept' and verdict ~= 'reject' then
  return redis.error_reply('settle: verdict must be accept or reject, got ' .. verdict)
end
local g = get_json(groups, gid)
if not g then return ignored(counters, 'unknown group') end
if g.state == 'rejected' then return {'rejected', g.reason} end
if g.state ~= 'in_flight' then return {'accepted', ''} end

record_verdict(counters, groups, KEYS[3], now, gid, g, verdict == 'accept', ARGV[4])
if verdict == 'accept' then return {'accepted', ''} end
return {'rejected', ARGV[4]}
