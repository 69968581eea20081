-- submit.lua: add prompts to the farm, all or none. A prompt id already known to the
-- farm (pending, admitted, or judged at any time), or given twice in the submission,
-- refuses the whole submission.
--
-- KEYS[1] = counters hash
-- KEYS[2] = prompts hash (id -> prompt JSON)
-- KEYS[3] = groups hash
-- KEYS[4] = pending list of prompt ids
-- KEYS[5] = wake stream (an idle collector waits on it)
-- ARGV[1] = now (seconds)
-- ARGV[2], ARGV[3], ... = id, prompt JSON, id, prompt JSON, ...
-- Returns {'submitted', n} | {'duplicate', id, ...}

local dups = {'duplicate'}
local seen = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if seen[id] or redis.call('HEXISTS', KEYS[2], id) == 1
      or redis.call('HEXISTS', KEYS[3], id) == 1 then
    dups[#dups + 1] = id
  end
  seen[id] = true
end
if #dups > 1 then return dups end
local n = 0
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  redis.call('RPUSH', KEYS[4], ARGV[i])
  n = n + 1
end
bump(KEYS[1], 'submitted', n)
wake(KEYS[5], 'submit')
return {'submitted', n}
