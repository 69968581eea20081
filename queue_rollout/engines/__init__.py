"""What speaks to an inference replica and what stands in for one: the SGLang HTTP
client (``sglang``, with ``SGLANG_API.md``), the simulated replica's timing model
(``sim_model``) and its HTTP server (``sim_server``). Engines never touch Redis, RQ or
the ledger; the simulated replica imports nothing else from the package."""
