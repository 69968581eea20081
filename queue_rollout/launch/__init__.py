"""Launching a farm's processes: ``up`` (a whole farm on one machine: embedded Redis,
simulated replicas, a worker per replica, the collector) and ``node`` (a replica and a
pinned worker per GPU on one host, restarted with backoff)."""
