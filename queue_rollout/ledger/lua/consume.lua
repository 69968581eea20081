-- consume.lua: on a farm of several cells, a cell's half of a batch acknowledged on the
-- control Redis (ack.lua there): the groups of the batch that this cell ran, accepted
-- here, are consumed and their detail deleted, as ack.lua does on a farm of one.
-- A group not accepted here (consumed already, or unknown) is passed over: sending the
-- same groups again changes nothing.
--
-- KEYS[1] = counters hash
-- KEYS[2] = groups hash
-- KEYS[3] = ready list of group ids (the cell's: its accepted groups wait here)
-- KEYS[4] = prompts hash
-- KEYS[5] = attempts hash
-- KEYS[6] = results hash
-- KEYS[7] = history hash (group id -> its story, for `trace`)
-- ARGV[1] = now (seconds)
-- ARGV[2] = the batch's id
-- ARGV[3] = its consumer
-- ARGV[4], ARGV[5], ... = the batch's groups that this cell ran
-- Returns {'consumed', number of groups consumed by this call}

local now = tonumber(ARGV[1])
local k = {groups = KEYS[2], prompts = KEYS[4], attempts = KEYS[5], results = KEYS[6],
           history = KEYS[7]}
local n = 0
for i = 4, #ARGV do
  local gid = ARGV[i]
  local g = get_json(KEYS[2], gid)
  if g and g.state == 'accepted' then
    redis.call('LREM', KEYS[3], 1, gid)
    consume_group(k, now, gid, g, ARGV[2], ARGV[3])
    n = n + 1
  end
end
bump(KEYS[1], 'consumed', n)
return {'consumed', n}
