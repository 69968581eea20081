"""The real-vllm bench's parts that need no server: its pool read from vLLM's metrics
and its calibration from windows of vLLM's metric samples."""

from __future__ import annotations

import pytest

from queue_rollout.engines.concurrency import VLLM_METRICS
from queue_rollout.errors import QueueRolloutError
from queue_rollout.lab.bench.real_sglang import calibrate
from queue_rollout.lab.bench.real_vllm import STEPS, pool_tokens, step_windows

#: A cache_config_info line as vLLM 0.32.0 exports it (labels abridged).
INFO = ('vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
        'num_gpu_blocks="1170",prefix_caching_hash_algo="sha256"} 1.0')


def test_the_pool_is_blocks_times_block_size_and_its_absence_is_said():
    assert pool_tokens(f"# HELP x\n{INFO}\nvllm:num_requests_running 2.0\n") == 1170 * 128
    with pytest.raises(QueueRolloutError, match="no vllm:cache_config_info"):
        pool_tokens("vllm:num_requests_running 2.0\n")


def totals(steps: float, running: float, usage: float) -> dict[str, float]:
    return {STEPS: steps, VLLM_METRICS.running: running, VLLM_METRICS.token_usage: usage}


def test_windows_of_metric_samples_recover_a_known_step():
    """Two replicas stepping at a known step (5 ms + 0.6 ms per request + 1.5 us per held
    token), their running requests and KV usage changing now and then, sampled every
    0.1 s; an idle stretch on the first replica (no steps) gives no window."""
    pool = 10_000

    def step_ms(n: float, held: float) -> float:
        return 5.0 + 0.6 * n + 1.5 * held / 1000

    plan = [(1, 0.05), (2, 0.1), (4, 0.2), (8, 0.4), (8, 0.8), (2, 0.6)]  # per 1.2 s
    samples = []
    steps = [0.0, 0.0]
    t = 0.0
    for k, (n, usage) in enumerate(plan * 2):
        for _ in range(12):
            replicas = []
            for r in (0, 1):
                idle = r == 0 and k == 3
                m = n if r == 0 else max(1, n // 2)
                steps[r] += 0.0 if idle else 100.0 / step_ms(m, usage * pool)
                replicas.append(totals(steps[r], 0.0 if idle else m, usage))
            samples.append((t, replicas))
            t += 0.1
    lines = step_windows(samples, [pool, pool], window_s=0.55)
    assert lines and all(line["running"] > 0 for line in lines)
    fitted = calibrate(lines)
    assert fitted["step_ms"] == pytest.approx(5.0, rel=0.1)
    assert fitted["step_ms_per_request"] == pytest.approx(0.6, rel=0.1)
    assert fitted["step_us_per_context_token"] == pytest.approx(1.5, rel=0.1)
