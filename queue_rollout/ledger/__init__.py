"""The ledger: the farm's truth in Redis.

Key names (``keys``), record formats (``records``), one Lua script per operation
(``lua/``, loaded by ``scripts``), the typed wrapper over them (``core.Ledger``), the
job queues that hand admitted attempts to RQ workers (``jobs``), the invariant checker
(``doctor``), the farm's recorded shape and ledger schema (``shape``), Redis connections and the
translation of Redis errors (``connection``), the embedded ``redis-server``
(``embedded``) and the status snapshot (``status``). Nothing here imports the parts
above it: collector, client, workers, engines, CLI or bench.
"""
