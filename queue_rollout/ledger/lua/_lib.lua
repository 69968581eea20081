-- _lib.lua: helpers prepended to every ledger script when it is loaded.
-- KEYS[1] = none of its own: every function takes the key names it touches as
--            arguments, so each script's header stays the whole truth about its keys
-- ARGV[1] = none of its own
--
-- Records are JSON objects in farm-wide hashes:
--   groups[gid]    {id, G, mode, state, done, failed, version, admitted_at, aids, ...}
--                  aids: every attempt id the group ever had, comma-separated
--                  cell: on the control Redis of a farm of cells, the cell that runs
--                  it (its attempts are there: aids is empty here)
--   attempts[aid]  {g, m, n, stops, state, worker, replica, boot, lease, seq, ...}
--                  h: its lease holder (the worker process), whose lease its own
--                  follows while it reports nothing new
--                  rid: the request in flight when not the attempt id (a later turn);
--                  tool: true while a running attempt waits on a tool (counted in
--                  the tool_wait counter)
--                  pl: true in a farm that places groups (its load is counted on a
--                  replica); p: the worker whose queue a queued attempt waits on
-- Group states:   in_flight -> complete -> accepted -> delivered -> consumed | rejected
-- Attempt states: queued -> running -> doubtful -> finished | failed | stopped | lost
-- A member's current attempt is its one attempt not stopped or lost; the member has
-- ended when that attempt is finished or failed.

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

-- Whether one more group in flight would pass the staleness budget, and the policy
-- version: the budget admits while (accepted - baseline) + in_flight <= (max_staleness
-- + version + 1) * B, the accepted groups counted from the baseline set_version keeps
-- (set_version.lua says why).
local function over_budget(counters, state, B, max_staleness)
  local st = redis.call('HMGET', state, 'version', 'budget_baseline')
  local version, baseline = tonumber(st[1] or '0'), tonumber(st[2] or '0')
  return counter(counters, 'accepted') - baseline + counter(counters, 'in_flight') + 1
    > (max_staleness + version + 1) * B, version
end

-- An admission refused for *reason*: counted, and kept in the recent refusals hash
-- (reason -> JSON [10-second bucket, its count and the 5 before it's, oldest first]).
local function refuse_admission(counters, refusals, now, reason)
  bump(counters, 'blocked:' .. reason, 1)
  local bucket = math.floor(now / 10)
  local raw = redis.call('HGET', refusals, reason)
  local counts = {0, 0, 0, 0, 0, 0}
  if raw then
    local old = cjson.decode(raw)
    local shift = math.max(0, bucket - old[1])  -- 0 also when the clock stepped back
    for i = 1, 6 - shift do counts[i] = old[i + 1 + shift] end
  end
  counts[6] = counts[6] + 1
  redis.call('HSET', refusals, reason, cjson.encode({bucket, unpack(counts)}))
  return {'blocked', reason}
end

-- A complete group's verdict on its record: it leaves in_flight; accepted, it joins the
-- ready list and the accepted count; rejected, it keeps its reason.
local function record_verdict(counters, groups, ready, now, gid, g, accept, reason)
  g.judged_at = now
  bump(counters, 'in_flight', -1)
  if accept then
    g.state = 'accepted'
    redis.call('RPUSH', ready, gid)
    bump(counters, 'accepted', 1)
  else
    g.state = 'rejected'
    g.reason = reason
  end
  put_json(groups, gid, g)
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
    if a.tool then bump(counters, 'tool_wait', -1) end
    redis.call('ZREM', leases, aid)
  elseif a.state == 'doubtful' then
    bump(counters, 'doubtful', -1)
    redis.call('ZREM', doubt, aid)
  end
end

-- Placement: *by* attempts more (or fewer) on *worker*'s replica. r holds the key
-- names: r.load (worker -> load), r.free (worker -> slots - load, for the workers
-- admission may place on; a worker not there is left out of it).
local function replica_load(r, worker, by)
  if redis.call('HINCRBY', r.load, worker, by) == 0 then redis.call('HDEL', r.load, worker) end
  redis.call('ZADD', r.free, 'XX', 'INCR', -by, worker)
end

-- The outbox entry of a queued attempt: its id and the worker whose RQ queue its job
-- goes to ('aid@worker'), or the shared queue ('aid@'); the relay needs nothing else.
local function outbox_entry(aid, a)
  return aid .. '@' .. (a.p or '')
end

-- A placed attempt leaves its replica's queue (started, or moved to the shared one).
local function unplace(r, aid, a)
  if a.p then
    replica_load(r, a.p, -1)
    redis.call('ZREM', r.placed, aid)
    a.p = nil
  end
end

-- Why a notification about an attempt that is no longer live is refused.
local function ended_reason(a)
  if a.state == 'stopped' or a.state == 'lost' then return 'superseded attempt' end
  return 'attempt is ' .. a.state
end

-- An episode ended: its current attempt finished, or it failed for good. Sample mode
-- gives its slot back now; group mode gives all G back when the last member ends.
-- A completed group goes on the events stream. Returns true when the group completed.
-- Slots held are never stored per episode: they follow from the group's mode, state
-- and done count (doctor recomputes them so).
local function episode_terminal(k, now, g, outcome)
  g.done = g.done + 1
  if g.done == 1 and g.G > 1 then bump(k.counters, 'partial', 1) end
  if g.done == g.G and g.G > 1 then bump(k.counters, 'partial', -1) end
  if outcome == 'failed' then
    g.failed = g.failed + 1
    bump(k.counters, 'failed', 1)
  else
    bump(k.counters, 'finished', 1)
  end
  if g.mode == 'sample' then bump(k.counters, 'reserved', -1) end
  local complete = g.done >= g.G
  if complete then
    if g.mode == 'group' then bump(k.counters, 'reserved', -g.G) end
    g.state = 'complete'
    g.completed_at = now
    redis.call('XADD', k.events, '*', 'group', g.id, 'failed', g.failed)
  end
  put_json(k.groups, g.id, g)
  return complete
end

-- Wake an idle collector: something it acts on changed (prompts, the pause flag, the
-- version). A short capped stream; the entry's content does not matter.
local function wake(key, why)
  redis.call('XADD', key, 'MAXLEN', '~', 100, '*', 'why', why)
end

-- One observation for the metrics exporter's histograms (a capped stream).
local function observe(key, kind, value)
  redis.call('XADD', key, 'MAXLEN', '~', 100000, '*', 'k', kind, 'v', value)
end

-- Delete a judged group's bulky detail (prompt, attempts, results); the small group
-- record stays so its id is never admitted or delivered twice.
local function purge_group(k, g)
  redis.call('HDEL', k.prompts, g.id)
  for aid in string.gmatch(g.aids, '[^,]+') do
    redis.call('HDEL', k.attempts, aid)
  end
  for m = 0, g.G - 1 do
    redis.call('HDEL', k.results, episode_field(g.id, m))
  end
end

-- A group's story for `trace` (history.max_groups, history.ttl_s): admit.lua gives each
-- group admitted an entry in the history hash, its first event; every later event is a
-- JSON object appended on a line of its own. A group without an entry (the history is
-- off, or its entry left: the oldest beyond the cap, or older than the age) keeps none,
-- so an event never brings an entry back.
local function history_add(key, gid, event)
  local story = redis.call('HGET', key, gid)
  if story then redis.call('HSET', key, gid, story .. '\n' .. cjson.encode(event)) end
end

-- A group of an acknowledged batch: consumed, its story told so, its detail deleted.
local function consume_group(k, now, gid, g, batch_id, consumer)
  g.state = 'consumed'
  g.consumed_at = now
  put_json(k.groups, gid, g)
  history_add(k.history, gid, {e = 'acked', t = now, b = batch_id, c = consumer})
  purge_group(k, g)
end

-- A running attempt a becomes doubtful for *cause*: it keeps its slot, no retry starts
-- until the doubt is resolved. k holds the key names: k.counters, k.attempts, k.leases,
-- k.doubt, k.history.
local function become_doubtful(k, now, aid, a, cause)
  leave_live_state(k.counters, k.leases, k.doubt, aid, a)
  a.state = 'doubtful'
  a.doubt_at = now
  a.cause = cause
  put_json(k.attempts, aid, a)
  redis.call('ZADD', k.doubt, now, aid)
  bump(k.counters, 'doubtful', 1)
  bump(k.counters, 'doubts:' .. cause, 1)
  history_add(k.history, a.g, {e = 'doubt', t = now, a = aid, m = a.m, n = a.n, c = cause})
end
