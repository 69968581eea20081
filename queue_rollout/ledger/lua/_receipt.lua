-- _receipt.lua: wraps an operation when the farm waits for replicas
-- (farm.redis_wait_replicas > 0). A caller whose WAIT fell short cannot know whether
-- the replicas will keep the change, so it sends the same call again, with the same
-- receipt key, until they do: the first run stores its answer under the key, and a
-- resent call that finds the key answers the stored answer and changes nothing. An
-- answer that changed nothing (blocked, empty, ignored, redelivered, duplicate) is not
-- stored: sending that call again is as good as sending it the first time. The caller
-- deletes the key once enough replicas hold the change; the lifetime only bounds what
-- a caller that died in between leaves behind.
-- Loaded as: _lib.lua, then the operation inside `local function operation() ... end`,
-- then this file.
-- KEYS[1]       = the wrapped operation's first key: KEYS[1] .. KEYS[#KEYS-1] are its
--                 own keys, as its header names them
-- KEYS[#KEYS]   = the call's receipt key (string), after the operation's own keys
-- ARGV[1]       = the wrapped operation's first argument: ARGV[1] .. ARGV[#ARGV-2] are
--                 its own arguments, as its header names them
-- ARGV[#ARGV-1] = '1' when the call is sent again, '0' the first time
-- ARGV[#ARGV]   = the receipt's lifetime in seconds

local receipt = table.remove(KEYS)
local lifetime = table.remove(ARGV)
local resent = table.remove(ARGV) == '1'
if resent then
  local stored = redis.call('GET', receipt)
  if stored then
    redis.call('EXPIRE', receipt, lifetime)
    return cmsgpack.unpack(stored)
  end
end
local answer = operation()
local status = answer[1]
if status == 'blocked' or status == 'empty' or status == 'ignored'
    or status == 'redelivered' or status == 'duplicate' then
  return answer
end
redis.call('SET', receipt, cmsgpack.pack(answer), 'EX', lifetime)
return answer
