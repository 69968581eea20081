"""The exporter: every metric of DESIGN section 6, read from the ledger; histograms
fed from the observations stream; /metrics and /healthz on loopback."""

from __future__ import annotations

import urllib.request

import msgspec
import redis

from queue_rollout.collector.loop import Collector
from queue_rollout.collector.metrics import FarmMetrics
from queue_rollout.config import Config
from queue_rollout.ledger import cells
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import free_port
from queue_rollout.results import EpisodeResult, encode_result
from testkit import write_farm

DESIGN_METRICS = [
    "sample_slots", "sample_slots_reserved", "active_episodes", "doubtful_attempts",
    "groups_admitted_total", "groups_accepted_total", "groups_rejected_total",
    "groups_consumed_total", "episodes_finished_total", "episode_duration_seconds_bucket",
    "output_tokens_total", "batches_delivered_total", "batch_interval_seconds_bucket",
    "policy_version", "consumed_group_staleness_bucket", "admission_blocked_total",
    "workers_alive", "attempt_retries_total", "partial_groups", "redis_used_memory_bytes",
    "redis_wait_replicas", "redis_replicas_acked", "prefill_tokens_total",
    "batches_released_total", "acks_refused_total", "admission_mode_info", "paused",
    "rollout_interval_seconds_bucket",
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
            ledger.finish(aid, a.member, encode_result(EpisodeResult(
                member=a.member, output_ids=[1, 2], logprobs=[0.0, 0.0],
                version_runs=[(0, 2)],
                finish_reason="length", reward=float(a.member))), output_tokens=2,
                prefill_computed=100 if a.member == 0 else 1,
                prefill_cached=0 if a.member == 0 else 99)
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
        assert 'queue_rollout_episodes_finished_total{farm="m",outcome="finished"} 2.0' in text
        assert 'queue_rollout_prefill_tokens_total{farm="m",kind="computed"} 101.0' in text
        assert 'queue_rollout_prefill_tokens_total{farm="m",kind="cached"} 99.0' in text
        assert 'queue_rollout_admission_blocked_total{farm="m",reason="capacity"} 1.0' in text
        assert 'queue_rollout_admission_mode_info{farm="m",mode="sample"} 1.0' in text
        assert sample(text, "paused") == 0
        ledger.set_paused(True)
        r.hset(ledger.keys.counters, mapping={"failed:oversized": 3, "failed:max_attempts": 1,
                                              "released": 2, "acks_refused": 1})
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert sample(text, "batches_released_total") == 2
        assert sample(text, "paused") == 1
        assert sample(text, "acks_refused_total") == 1
        assert 'queue_rollout_episodes_failed_total{farm="m",reason="oversized"} 3.0' in text
        assert 'queue_rollout_episodes_failed_total{farm="m",reason="max_attempts"} 1.0' in text
        assert 'queue_rollout_episodes_failed_total{farm="m",reason="workflow"} 0.0' in text
        assert sample(text, "output_tokens_total") == 4 and sample(text, "policy_version") == 2
        assert sample(text, "episode_duration_seconds_count") == 2
        assert sample(text, "episode_duration_seconds_sum") == 24  # 12 s each
        assert 'queue_rollout_consumed_group_staleness_bucket{farm="m",le="2.0"} 1.0' in text
        assert 'queue_rollout_consumed_group_staleness_bucket{farm="m",le="1.0"} 0.0' in text
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
    assert 'queue_rollout_worker_slots{farm="ws",worker="n1-gpu0"} 16.0' in text
    assert 'queue_rollout_worker_slots{farm="ws",worker="n1-gpu1"} 3.0' in text
    assert sample(text, "sample_slots") == 19  # "auto": their sum
    registry.deregister("n1-gpu1")
    text = FarmMetrics(ledger, config).exposition().decode()
    assert 'worker="n1-gpu1"' not in text and sample(text, "sample_slots") == 16


def test_every_series_carries_its_farm_s_name(r, clock):
    """Two farms on one Redis, each exporter serving /metrics: every sample line of each
    (gauges, counters, labelled counters, histogram buckets, sums and counts) carries
    farm="<its farm>", and nothing of the other farm."""
    import re

    texts = {}
    for name in ("fa", "fb"):
        config = msgspec.convert({"farm": {"name": name}, "metrics": {"port": free_port()},
                                  "rollout": {"group_size": 2, "batch_size": 1}}, Config)
        ledger = Ledger(r, name, config.rollout, clock=clock)
        ledger.submit([("p0", b'{"prompt": "x"}')])
        Collector(ledger, config, name="c").step()
        metrics = FarmMetrics(ledger, config)  # its histograms see what follows
        for aid in ledger.group("p0").attempt_ids:
            ledger.start(aid, "w", "r", "b", 30)
            a = ledger.attempt(aid)
            ledger.finish(aid, a.member, encode_result(EpisodeResult(
                member=a.member, output_ids=[1], logprobs=[0.0], version_runs=[(0, 1)],
                finish_reason="length", reward=float(a.member))), output_tokens=1)
        port = metrics.serve()
        try:
            texts[name] = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                 timeout=5).read().decode()
        finally:
            metrics.close()
    for name, text in texts.items():
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert len(samples) > 50
        labels = [dict(re.findall(r'(\w+)="([^"]*)"', s.split("{", 1)[1].rsplit("}", 1)[0]))
                  if "{" in s else {} for s in samples]
        assert [s for s, ls in zip(samples, labels, strict=True) if ls.get("farm") != name] == []
        assert sample(text, "episode_duration_seconds_count") == 2  # histograms too
        assert sample(text, "groups_admitted_total") == 1


def test_a_metrics_port_in_use_is_one_line_naming_its_key_and_the_collector_exits_2(
        r, redis_url, tmp_path):
    import socket
    import subprocess

    from queue_rollout.errors import ConfigError
    from queue_rollout.procs import cli_exe

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        said = (f"metrics.port {port} is in use: [Errno 98] Address already in use "
                f"(127.0.0.1:{port}); stop what holds it or choose another port")
        farm = {"farm": {"name": "mp", "redis_url": redis_url}, "metrics": {"port": port}}
        config = msgspec.convert(farm, Config)
        try:
            FarmMetrics(Ledger.from_config(r, config), config).serve()
        except ConfigError as exc:
            assert str(exc) == said and exc.exit_code == 2
        else:
            raise AssertionError("served on a port in use")
        toml = write_farm(tmp_path / "farm.toml", **farm)
        done = subprocess.run([cli_exe(), "collector", "-c", str(toml)], capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 2 and done.stderr == f"queue-rollout: {said}\n"


def test_a_farm_of_cells_is_exported_as_one_and_each_cell_apart(redis_url, clock):
    """The control Redis and two cells as databases of one server: the farm's figures
    summed over the cells (the budget's and the batches' the control Redis's), a few of
    each cell labelled, the histograms fed from every server's observations."""
    base = redis_url.rsplit("/", 1)[0]
    clients = [redis.Redis.from_url(f"{base}/{db}") for db in (1, 2, 3)]
    try:
        config = msgspec.convert({
            "farm": {"name": "m", "redis_url": f"{base}/1"},
            "rollout": {"group_size": 2, "batch_size": 1, "max_concurrent_samples": 8,
                        "max_staleness": 10},
            "cells": [{"name": "a", "redis_url": f"{base}/2"},
                      {"name": "b", "redis_url": f"{base}/3"}]}, Config)
        control, a, b = (Ledger(c, "m", config.for_cell(n).rollout if n else config.rollout,
                                clock=clock) for c, n in zip(clients, ("", "a", "b"), strict=True))
        for name, cell in (("a", a), ("b", b)):
            cell.submit([(f"{name}{i}", b'{"prompt": "x"}') for i in range(2)])
            admission = cells.admit_next(control, cell, name)
            cells.admit_next(control, cell, name)
            for m, aid in enumerate(admission.attempt_ids):
                cell.start(aid, "w", "r", "b", 30)
                clock.advance(7)
                cell.finish(aid, m, b"r", output_tokens=3)
            cells.judge(control, cell, admission.group_id, accept=True)
        running = a.group("a1").attempt_ids[0]
        a.start(running, "w", "r", "b", 30)
        delivery = control.pop_batch("t")
        assert delivery is not None
        cells.ack(control, {"a": a, "b": b}, "t", delivery.batch.id, delivery.batch.groups)
        metrics = FarmMetrics(control, config, {"a": a, "b": b})
        for m, aid in enumerate(b.group("b1").attempt_ids):  # after the exporter began
            b.start(aid, "w", "r", "b", 30)
            clock.advance(7)
            b.finish(aid, m, b"r", output_tokens=3)
        text = metrics.exposition().decode()
        assert sample(text, "episode_duration_seconds_count") == 2  # from cell b's stream
        assert sample(text, "sample_slots") == 8  # 4 a cell
        assert sample(text, "sample_slots_reserved") == 2  # a1's (b1 ended)
        assert sample(text, "active_episodes") == 1
        assert sample(text, "groups_admitted_total") == 4  # the cells' admissions
        assert sample(text, "groups_in_flight") == 2  # a1, b1: the control Redis's
        assert sample(text, "groups_accepted_total") == 2
        assert sample(text, "groups_consumed_total") == 1
        assert sample(text, "output_tokens_total") == 18
        assert 'queue_rollout_cell_active_episodes{cell="a",farm="m"} 1.0' in text
        assert 'queue_rollout_cell_sample_slots{cell="b",farm="m"} 4.0' in text
    finally:
        for c in clients:
            c.close()
