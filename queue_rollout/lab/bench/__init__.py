"""``queue-rollout bench``: the pilots through the real stack, the control plane and
the ledger, each with the command that reproduces it in docs/en/benchmarks.md."""
