"""The kv-pressure profile: fixed slots against adaptive concurrency, in the ideal
schedule at the profile's own shape and through a small real stack; and the controls
(long-tail and equal, where memory is not short)."""

from __future__ import annotations

import json

import pytest

from queue_rollout.lab.bench import kv_pressure
from queue_rollout.lab.bench.kv_pressure import controls, run_kv_pressure
from queue_rollout.lab.bench.pilot import open_bench
from queue_rollout.lab.bench.report import kv_markdown, kv_text
from queue_rollout.lab.virtual.ideal import ideal_schedule
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import KV_PRESSURE
from queue_rollout.ledger.connection import connect

#: Two replicas of 4 slots whose pool holds one and a half long members (512 tokens).
SMALL = Shape(prompts=8, group_size=4, batch_size=2, replicas=2, slots_per_replica=4,
              train_s=0.5, train_batches=2, max_total_tokens=24_576, max_staleness=3)
FAST = Scale(time=0.02, tokens=1 / 32)


@pytest.fixture(scope="module")
def ideal(redis_server):
    """(mode, slots) -> the ideal schedule of kv-pressure at its own shape."""
    shape, scale = KV_PRESSURE.shape, Scale()
    assert shape is not None
    prompts = KV_PRESSURE.manifest(shape, scale)
    client = connect(redis_server.url)
    try:
        return {(mode, slots): ideal_schedule(client, shape, scale, prompts, mode,
                                              shape.max_staleness, f"kvp-{mode}-{slots}",
                                              adaptive=slots == "adaptive")
                for mode in ("group", "sample") for slots in ("fixed", "adaptive")}
    finally:
        client.close()


def test_group_admission_never_fills_a_pool_and_its_limits_never_move(ideal):
    fixed, adaptive = ideal[("group", "fixed")], ideal[("group", "adaptive")]
    assert fixed.retractions == adaptive.retractions == 0
    assert adaptive.limit_changes == 0 and adaptive.mean_slots_limit == 128
    assert adaptive.all_work_s == fixed.all_work_s


def test_refill_fills_the_pools_and_adaptive_limits_retract_less(ideal):
    fixed, adaptive = ideal[("sample", "fixed")], ideal[("sample", "adaptive")]
    assert fixed.retractions > 0 and fixed.recomputed_tokens > 0
    assert adaptive.limit_changes > 0 and adaptive.mean_slots_limit < 128
    assert adaptive.retractions <= fixed.retractions
    assert adaptive.recomputed_tokens <= fixed.recomputed_tokens
    assert adaptive.output_tokens == fixed.output_tokens


@pytest.mark.bench
def test_where_memory_is_not_short_adaptive_slots_stay_within_three_percent(redis_server):
    result = controls(redis_server.url, Scale())
    assert set(result) == {"long-tail/group", "long-tail/sample", "equal/group",
                           "equal/sample"}
    for name, c in result.items():
        assert abs(c["change"]) <= 0.03, (name, c)


@pytest.mark.bench
def test_a_small_kv_pressure_bench_runs_four_audited_runs(tmp_path, redis_server,
                                                          monkeypatch):
    # the controls are the test above's: not run again here
    monkeypatch.setattr(kv_pressure, "controls", lambda url, scale: {})
    bench = open_bench(tmp_path, SMALL, FAST, redis_server.url, lambda line: None)
    try:
        result, runs = run_kv_pressure(bench, KV_PRESSURE, max_staleness=3)
    finally:
        bench.stop()
    assert list(result["runs"]) == ["group/fixed", "group/adaptive", "sample/fixed",
                                    "sample/adaptive"]
    assert result["shape"]["max_total_tokens"] == FAST.length(24_576)
    for key, run in result["runs"].items():
        assert runs[key].counters["finished"] == 32
        assert runs[key].adaptive == key.endswith("/adaptive")
        assert run["retractions"] == sum(e["retractions"] for e in runs[key].requests)
        assert run["recomputed_prefill_tokens"] >= 0
        assert run["tokens_per_s"] == pytest.approx(
            runs[key].output_tokens / runs[key].all_work_s, rel=1e-3)
        assert run["ideal"]["mean_slots_limit"] <= 8
    # the ideal schedule of a full pool: retractions with fixed slots, limits that move
    assert result["runs"]["sample/fixed"]["ideal"]["retractions"] > 0
    assert result["runs"]["sample/adaptive"]["ideal"]["limit_changes"] > 0
    assert set(result["change"]) == {"group", "sample"}
    for mode, u in result["unlimited_pool"].items():  # memory never short: no retraction
        assert u["retractions"] == 0
        assert u["all_work_completion_s"] <= (
            result["runs"][f"{mode}/fixed"]["ideal"]["all_work_completion_s"])
    assert result["controls"] == {}
    json.dumps(result)
    text, md = kv_text(result), kv_markdown(result)
    assert "recomputed prefill" in text and "| retractions" in md
