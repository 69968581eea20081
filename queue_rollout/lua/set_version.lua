-- set_version.lua: set the policy version (the trainer's step). The staleness budget
-- grows by B groups per version.
--
-- KEYS[1] = state hash
-- ARGV[1] = now (seconds)
-- ARGV[2] = new version (integer >= 0)
-- Returns {'version', previous version}

local previous = redis.call('HGET', KEYS[1], 'version') or '0'
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'version_at', ARGV[1])
return {'version', previous}
