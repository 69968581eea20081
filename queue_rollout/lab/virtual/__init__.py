"""The virtual-time farm: the real ledger scripts on a real Redis with a clock moved by
hand (``clock``), and the replicas' timing model advanced between events (``farm``);
the ideal schedule run on it (``ideal``), the farm's shape and scale (``shape``), and
what a run's batch times say (``figures``). ``demo --virtual``, the bench's ideal
schedule and the planner run on it."""
