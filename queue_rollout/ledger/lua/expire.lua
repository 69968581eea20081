-- expire.lua: the running attempts whose lease has run out. An attempt's lease is its
-- own (renewed by its process's renewals, progress.lua) or, while its lease holder (the
-- worker process that runs it) is live, the holder's: an attempt whose own renewals
-- stopped while its process still renews is extended to the holder's lease, not
-- doubted. An attempt whose holder's lease has run out too (or that has none) becomes
-- doubtful ('lease_expired'), as doubt.lua does.
-- Holders whose lease has run out leave the holders set; an entry with no running
-- attempt behind it leaves the leases set (counted as ignored).
--
-- KEYS[1] = counters hash
-- KEYS[2] = attempts hash
-- KEYS[3] = leases sorted set (attempt id -> lease expiry)
-- KEYS[4] = doubt sorted set (attempt id -> doubtful since)
-- KEYS[5] = history hash (group id -> its story, for `trace`)
-- KEYS[6] = holders sorted set (lease holder -> lease expiry)
-- ARGV[1] = now (seconds)
-- ARGV[2] = the most expired leases looked at in this call
-- Returns {looked at, extended, doubted attempt id, ...}: a caller that was answered
--         as many looked at as it allowed calls again

local k = {counters = KEYS[1], attempts = KEYS[2], leases = KEYS[3], doubt = KEYS[4],
           history = KEYS[5]}
local holders = KEYS[6]
local now, most = tonumber(ARGV[1]), tonumber(ARGV[2])

-- The lease holder a record names, read from its JSON text without decoding it all (a
-- sweep may extend many leases): cjson writes '/' escaped; any other escape, or no
-- holder, answers nil and the caller decodes the record.
local function holder_of(raw)
  local h = string.match(raw, '"h":"([^"]*)"')
  if not h then return nil end
  h = string.gsub(h, '\\/', '/')
  if string.find(h, '\\', 1, true) then return nil end
  return h
end

redis.call('ZREMRANGEBYSCORE', holders, '-inf', '(' .. now)
local due = redis.call('ZRANGEBYSCORE', k.leases, '-inf', now, 'LIMIT', 0, most)
local extended, doubted = 0, {}
for _, aid in ipairs(due) do
  -- an attempt in the leases set runs (doctor checks it): its holder's lease is read
  -- first, the record decoded only to doubt it
  local raw = redis.call('HGET', k.attempts, aid)
  local h, a = raw and holder_of(raw), nil
  if raw and not h then
    a = cjson.decode(raw)
    h = a.h
  end
  local upto = h and tonumber(redis.call('ZSCORE', holders, h) or '0') or 0
  if upto > now then
    redis.call('ZADD', k.leases, upto, aid)
    extended = extended + 1
  else
    a = a or (raw and cjson.decode(raw))
    if not a or a.state ~= 'running' then
      redis.call('ZREM', k.leases, aid)  -- a stale entry: no running attempt behind it
      bump(k.counters, 'ignored', 1)
    else
      become_doubtful(k, now, aid, a, 'lease_expired')
      doubted[#doubted + 1] = aid
    end
  end
end
local out = {#due, extended}
for _, aid in ipairs(doubted) do out[#out + 1] = aid end
return out
