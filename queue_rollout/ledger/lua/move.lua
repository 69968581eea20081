-- move.lua: queued attempts placed on one worker's replica go to the shared queue,
-- where any worker takes them: the replica did not start them in time, or its worker
-- is gone. The attempt stays queued; its load leaves the replica, and its job leaves
-- the replica's queue for the shared queue's tail in the same step. An attempt no
-- longer queued on that worker (started meanwhile, moved already) is left alone, so
-- moving never runs an attempt twice: start lets one claim win wherever its job waits.
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = replica free slots sorted set
-- KEYS[4] = replica load hash
-- KEYS[5] = placed sorted set
-- KEYS[6] = the worker's RQ queue (list of attempt ids)
-- KEYS[7] = the shared RQ queue (list of attempt ids)
-- ARGV[1] = now (seconds)
-- ARGV[2] = worker id the attempts were placed on
-- ARGV[3 ..] = attempt ids
-- Returns {'moved', count}

local counters, worker = KEYS[1], ARGV[2]
local r = {free = KEYS[3], load = KEYS[4], placed = KEYS[5]}
local moved = 0
for i = 3, #ARGV do
  local aid = ARGV[i]
  local a = get_json(KEYS[2], aid)
  if a and a.state == 'queued' and a.p == worker then
    unplace(r, aid, a)
    put_json(KEYS[2], aid, a)
    redis.call('LREM', KEYS[6], 1, aid)
    redis.call('RPUSH', KEYS[7], aid)
    moved = moved + 1
  elseif not (a and a.p) then
    redis.call('ZREM', r.placed, aid)  -- left over: nothing waits on a replica
  end
end
bump(counters, 'placements:moved', moved)
return {'moved', moved}
