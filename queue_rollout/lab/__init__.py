"""The lab: what measures, models and demonstrates the farm without being part of it.

``sim`` (the engine model and the simulated replica), ``virtual`` (the virtual-time
farm: the real ledger scripts with a hand-moved clock), ``workloads`` (the pilots'
profiles), ``bench`` (``queue-rollout bench``), ``plan`` (``queue-rollout plan``) and
``demo`` (``queue-rollout demo``); ``trainer`` (the stand-in trainer), ``redis_info``
(Redis's own counters) and ``plots`` (matplotlib), which the bench, the planner and the
demo share. The lab imports the farm; the farm never imports the lab (an import-linter
contract), and starts a simulated replica only as a process, by its command."""
