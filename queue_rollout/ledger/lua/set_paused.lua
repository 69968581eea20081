-- set_paused.lua: raise or clear the pause flag. While it is raised nothing is admitted.
-- Each raise starts a new pause epoch: workers acknowledge the epoch once their
-- replica has paused in the given mode, which is what pause() waits for.
--
-- KEYS[1] = state hash (paused, paused_at, pause_epoch, pause_mode, resumed_at)
-- KEYS[2] = wake stream (an idle collector waits on it)
-- ARGV[1] = now (seconds)
-- ARGV[2] = "1" to pause, "0" to resume
-- ARGV[3] = pause mode when pausing: "in_place" or "abort"
-- Returns {'paused', previous flag, epoch} | {'resumed', previous flag}

local previous = redis.call('HGET', KEYS[1], 'paused') or '0'
redis.call('HSET', KEYS[1], 'paused', ARGV[2], 'paused_at', ARGV[1])
if ARGV[2] == '1' then
  local epoch = redis.call('HINCRBY', KEYS[1], 'pause_epoch', 1)
  redis.call('HSET', KEYS[1], 'pause_mode', ARGV[3])
  return {'paused', previous, epoch}
end
if previous == '1' then redis.call('HSET', KEYS[1], 'resumed_at', ARGV[1]) end
wake(KEYS[2], 'resume')
return {'resumed', previous}
