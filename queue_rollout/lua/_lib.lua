-- _lib.lua: helpers prepended to every ledger script when it is loaded.
-- It reads no KEYS and no ARGV of its own: every function takes the key names it
-- touches as arguments, so each script's header stays the whole truth about its keys.
--
-- Records are JSON objects in farm-wide hashes:
--   groups[gid]        {id, G, mode, state, done, failed, version, admitted_at, ...}
--   episodes[gid/m]    {g, m, aid, held, state, n, stops, aids}
--   attempts[aid]      {g, m, n, state, worker, replica, boot, lease, seq, tokens, ...}
-- Group states:   in_flight -> complete -> accepted -> delivered -> consumed | rejected
-- Episode states: active -> finished | failed
-- Attempt states: queued -> running -> doubtful -> finished | failed | stopped | lost

local function get_json(key, field)
  local raw = redis.call('HGET', key, field)
  if not raw then return nil end
  return cjson.decode(raw)
end

local function put_json(key, field, obj)
  redis.call('HSET', key, field, cjson.encode(obj))
end

local function bump(counters, field, by)
  if by ~= 0 then redis.call('HINCRBY', counters, field, by) end
end

local function counter(counters, field)
  return tonumber(redis.call('HGET', counters, field) or '0')
end

local function episode_field(gid, m)
  return gid .. '/' .. m
end

-- Every refusal of a notification goes through here: counted, and answered
-- {'ignored', reason} so the caller can log it.
local function ignored(counters, reason)
  redis.call('HINCRBY', counters, 'ignored', 1)
  return {'ignored', reason}
end

-- Take an attempt out of the live sets (running or doubtful) and fix their counters.
local function leave_live_state(counters, leases, doubt, aid, a)
  if a.state == 'running' then
    bump(counters, 'running', -1)
    redis.call('ZREM', leases, aid)
  elseif a.state == 'doubtful' then
    bump(counters, 'doubtful', -1)
    redis.call('ZREM', doubt, aid)
  end
end

-- An episode reached a terminal state (finished or failed). Sample mode releases
-- its slot now; when the last member is terminal the group completes, every slot it
-- still holds is released (group mode) and the completion goes on the events stream.
-- Returns true when the group completed.
local function episode_terminal(k, now, g, e, outcome)
  e.state = outcome
  g.done = g.done + 1
  if outcome == 'failed' then
    g.failed = g.failed + 1
    bump(k.counters, 'failed', 1)
  else
    bump(k.counters, 'finished', 1)
  end
  if g.mode == 'sample' and e.held == 1 then
    e.held = 0
    bump(k.counters, 'reserved', -1)
  end
  put_json(k.episodes, episode_field(g.id, e.m), e)
  if g.done < g.G then
    put_json(k.groups, g.id, g)
    return false
  end
  -- in sample mode every member released its slot when it ended
  for m = 0, (g.mode == 'group' and g.G or 0) - 1 do
    local field = episode_field(g.id, m)
    local other = get_json(k.episodes, field)
    if other.held == 1 then
      other.held = 0
      bump(k.counters, 'reserved', -1)
      put_json(k.episodes, field, other)
    end
  end
  g.state = 'complete'
  g.completed_at = now
  put_json(k.groups, g.id, g)
  redis.call('XADD', k.events, '*', 'group', g.id, 'failed', g.failed)
  return true
end

-- Delete a judged group's bulky detail (prompt, results, episodes, attempts); the
-- small group record stays so its id is never admitted or delivered twice.
local function purge_group(k, g)
  redis.call('HDEL', k.prompts, g.id)
  for m = 0, g.G - 1 do
    local field = episode_field(g.id, m)
    local e = get_json(k.episodes, field)
    if e then
      for aid in string.gmatch(e.aids, '[^,]+') do
        redis.call('HDEL', k.attempts, aid)
      end
      redis.call('HDEL', k.episodes, field)
    end
    redis.call('HDEL', k.results, field)
  end
end
