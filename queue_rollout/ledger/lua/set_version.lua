-- set_version.lua: set the policy version (the trainer's step) and move the staleness
-- budget's baseline with it.
--
-- The budget admits while (accepted - baseline) + in_flight <= (max_staleness +
-- version + 1) * B. The baseline is set so that the groups consumed so far count as
-- version * B: baseline = consumed - version * B. A trainer that raises the version by
-- one per consumed batch leaves it where it was (0 on a farm that started at version
-- 0), so the budget is the familiar one; a version set without the matching batches
-- (a trainer resuming from a checkpoint, or rolled back) keeps the budget (max_staleness
-- + 1) * B groups ahead of what has been consumed, in both directions: no burst after a
-- jump up, no deadlock after a jump down. The accepted counter itself is untouched.
--
-- KEYS[1] = state hash (version, budget_baseline)
-- KEYS[2] = counters hash (consumed)
-- KEYS[3] = wake stream (an idle collector waits on it: the budget may have grown)
-- ARGV[1] = now (seconds)
-- ARGV[2] = new version (integer >= 0)
-- ARGV[3] = batch size B
-- Returns {'version', previous version, new budget baseline}

local version, B = tonumber(ARGV[2]), tonumber(ARGV[3])
local previous = redis.call('HGET', KEYS[1], 'version') or '0'
local baseline = counter(KEYS[2], 'consumed') - version * B
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'version_at', ARGV[1],
  'budget_baseline', baseline)
wake(KEYS[3], 'version')
return {'version', previous, baseline}
