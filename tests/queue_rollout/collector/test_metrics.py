"""The exporter: every metric of DESIGN section 6, read from the ledger; histograms
fed from the observations stream; /metrics and /healthz on loopback."""

from __future__ import annotations

import urllib.request

import msgspec

from queue_rollout.collector.loop import Collector
from queue_rollout.collector.metrics import FarmMetrics
from queue_rollout.config import Config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import free_port
from queue_rollout.results import EpisodeResult, encode_result

DESIGN_METRICS = [
    "sample_slots", "sample_slots_reserved", "active_episodes", "doubtful_attempts",
    "groups_admitted_total", "groups_accepted_total", "groups_rejected_total",
    "groups_consumed_total", "episodes_finished_total", "episode_duration_seconds_bucket",
    "output_tokens_total", "batches_delivered_total", "batch_interval_seconds_bucket",
    "policy_version", "consumed_group_staleness_bucket", "admission_blocked_total",
    "workers_alive", "attempt_retries_total", "partial_groups", "redis_used_memory_bytes",
    "redis_wait_replicas", "redis_replicas_acked", "prefill_tokens_total",
]


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(("queue_rollout_" + name + " ", "queue_rollout_" + name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_exports_every_design_metric_with_ledger_values(r, clock):
    config = msgspec.convert({"farm": {"name": "m"}, "metrics": {"port": free_port()},
                              "rollout": {"group_size": 2, "batch_size": 1,
                                          "max_concurrent_samples": 4}}, Config)
    ledger = Ledger(r, "m", config.rollout, clock=clock)
    ledger.submit([(f"p{i}", b'{"prompt": "x"}') for i in range(3)])
    collector = Collector(ledger, config, name="c")
    metrics = FarmMetrics(ledger, config)
    port = metrics.serve()
    try:
        collector.step()
        for aid in ledger.group("p0").attempt_ids:
            ledger.start(aid, "w", "r", "b", 30)
            clock.advance(12)
            a = ledger.attempt(aid)
            ledger.finish(aid, a.m, encode_result(EpisodeResult(
                member=a.m, output_ids=[1, 2], logprobs=[0.0, 0.0], version_runs=[(0, 2)],
                finish_reason="length", reward=float(a.m))), output_tokens=2,
                prefill_computed=100 if a.m == 0 else 1, prefill_cached=0 if a.m == 0 else 99)
        a0 = ledger.group("p1").attempt_ids[0]
        ledger.start(a0, "w", "r", "b", 30)
        ledger.mark_doubtful(a0, "lease_expired")
        collector.step()
        delivery = ledger.pop_batch("t")
        ledger.set_version(2)
        ledger.ack("t", delivery.batch.id)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for name in DESIGN_METRICS:
            assert "queue_rollout_" + name in text, name
        assert sample(text, "sample_slots") == 4 and sample(text, "sample_slots_reserved") == 4
        assert sample(text, "doubtful_attempts") == 1 and sample(text, "partial_groups") == 0
        assert 'queue_rollout_episodes_finished_total{outcome="finished"} 2.0' in text
        assert 'queue_rollout_prefill_tokens_total{kind="computed"} 101.0' in text
        assert 'queue_rollout_prefill_tokens_total{kind="cached"} 99.0' in text
        assert 'queue_rollout_admission_blocked_total{reason="capacity"} 1.0' in text
        r.hset(ledger.keys.counters, mapping={"failed:oversized": 3, "failed:max_attempts": 1})
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'queue_rollout_episodes_failed_total{reason="oversized"} 3.0' in text
        assert 'queue_rollout_episodes_failed_total{reason="max_attempts"} 1.0' in text
        assert 'queue_rollout_episodes_failed_total{reason="workflow"} 0.0' in text
        assert sample(text, "output_tokens_total") == 4 and sample(text, "policy_version") == 2
        assert sample(text, "episode_duration_seconds_count") == 2
        assert sample(text, "episode_duration_seconds_sum") == 24  # 12 s each
        assert 'queue_rollout_consumed_group_staleness_bucket{le="2.0"} 1.0' in text
        assert 'queue_rollout_consumed_group_staleness_bucket{le="1.0"} 0.0' in text
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.status == 200
        assert metrics._server.server_address[0] == "127.0.0.1"
    finally:
        metrics.close()


def test_the_exposition_passes_promtool_check_metrics(r, clock):
    import shutil
    import subprocess

    import pytest

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package; .ci/run installs it)")
    config = msgspec.convert({"farm": {"name": "pm"}}, Config)
    ledger = Ledger(r, "pm", config.rollout, clock=clock)
    ledger.submit([("p0", b'{"prompt": "x"}')])
    Collector(ledger, config, name="c").step()
    text = FarmMetrics(ledger, config).exposition()
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert check.returncode == 0, (check.stdout + check.stderr).decode()


def test_each_live_worker_s_slots_are_a_series_of_their_own(r):
    from queue_rollout.ledger.registry import Registry

    config = msgspec.convert({"farm": {"name": "ws"}, "rollout": {
        "group_size": 2, "max_concurrent_samples": "auto"}}, Config)
    ledger = Ledger.from_config(r, config)
    registry = Registry(r, ledger.keys, config.timeouts.lease)
    registry.register("n1-gpu0", {"slots": 16})
    registry.register("n1-gpu1", {"slots": 3})  # its adaptive limit
    text = FarmMetrics(ledger, config).exposition().decode()
    assert 'queue_rollout_worker_slots{worker="n1-gpu0"} 16.0' in text
    assert 'queue_rollout_worker_slots{worker="n1-gpu1"} 3.0' in text
    assert sample(text, "sample_slots") == 19  # "auto": their sum
    registry.deregister("n1-gpu1")
    text = FarmMetrics(ledger, config).exposition().decode()
    assert 'worker="n1-gpu1"' not in text and sample(text, "sample_slots") == 16
