-- reserve.lua: on a farm of several cells, the control Redis's half of admitting a
-- group: the farm-wide staleness budget and the pause flag, decided before the group's
-- cell takes its slots (admit.lua there, with this answer's version). A group reserved
-- here counts in flight at once, so a crash before its cell admits it can only hold
-- budget back (the group reserved but not started: the collector admits its reserved
-- groups first), never admit past the budget. Reserving a group reserved already
-- answers what the first call did, whatever the budget now: a retry is safe.
--
-- KEYS[1] = counters hash (the farm's: accepted, in_flight)
-- KEYS[2] = state hash (version, paused, budget_baseline)
-- KEYS[3] = groups hash (group id -> the farm's record of it: its cell, version, state)
-- KEYS[4] = recent refusals hash (as admit.lua keeps it)
-- ARGV[1] = now (seconds)
-- ARGV[2] = group id
-- ARGV[3] = the cell that is to run it
-- ARGV[4] = group size G
-- ARGV[5] = batch size B
-- ARGV[6] = max_staleness
-- ARGV[7] = mode: "group" or "sample"
-- Returns {'reserved', version, cell} | {'already', version, cell} (the first call's)
--       | {'blocked', 'paused'|'staleness'}

local counters, state, groups = KEYS[1], KEYS[2], KEYS[3]
local now, gid, cell = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local G, B, max_staleness = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

local g = get_json(groups, gid)
if g then return {'already', tostring(g.version), g.cell} end
if redis.call('HGET', state, 'paused') == '1' then
  return refuse_admission(counters, KEYS[4], now, 'paused')
end
local over, version = over_budget(counters, state, B, max_staleness)
if over then
  return refuse_admission(counters, KEYS[4], now, 'staleness')
end

put_json(groups, gid, {id = gid, G = G, mode = ARGV[7], cell = cell, state = 'in_flight',
  done = 0, failed = 0, version = version, admitted_at = now, aids = ''})
bump(counters, 'in_flight', 1)
return {'reserved', tostring(version), cell}
