"""``queue-rollout bench``: the benchmarks of DESIGN section 8."""
