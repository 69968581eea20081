-- set_paused.lua: raise or clear the pause flag. While it is raised nothing is admitted.
--
-- KEYS[1] = state hash
-- ARGV[1] = now (seconds)
-- ARGV[2] = "1" to pause, "0" to resume
-- Returns {'paused' | 'resumed', previous flag}

local previous = redis.call('HGET', KEYS[1], 'paused') or '0'
redis.call('HSET', KEYS[1], 'paused', ARGV[2], 'paused_at', ARGV[1])
if ARGV[2] == '1' then return {'paused', previous} end
return {'resumed', previous}
