"""What speaks to an inference replica: the SGLang HTTP client (``sglang``, with
``SGLANG_API.md``), the per-replica slot controller (``concurrency``) and what the farm
shares with a simulated replica (``synthetic``: seeded token ids, request hints).
Engines never touch Redis, RQ or the ledger."""
