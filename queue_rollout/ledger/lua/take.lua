-- take.lua: an episode process of a farm that places groups takes its next job without
-- waiting: from its replica's queue first, else from the shared queue, onto RQ's
-- intermediate list (where a job waits while a worker holds it). Loaded on its own,
-- without the ledger's library: it touches RQ's lists only.
--
-- KEYS[1] = the worker's RQ queue (list of attempt ids)
-- KEYS[2] = the shared RQ queue
-- KEYS[3] = RQ's intermediate list
-- ARGV[1] = none: the clock is not read
-- Returns the attempt id taken, or false when both queues are empty

return redis.call('LMOVE', KEYS[1], KEYS[3], 'LEFT', 'RIGHT')
  or redis.call('LMOVE', KEYS[2], KEYS[3], 'LEFT', 'RIGHT')
