"""bench peer-areal: AReaL's own rollout against the farm. The refusals, AReaL's report
as a run and its audit run here; the small version runs AReaL's engine (in its venv)
and both farm modes on simulated replicas in the bench tier."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from queue_rollout.errors import ConfigError
from queue_rollout.lab.bench.audit import audit
from queue_rollout.lab.bench.peer_areal import (
    CONTENDERS,
    FIGURES,
    PROMPT_TOKENS,
    areal_python,
    areal_run,
    peer_prompts,
    run_peer_areal,
)
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import PILOTS


def test_without_areals_python_the_bench_says_what_to_set(monkeypatch):
    monkeypatch.delenv("QUEUE_ROLLOUT_AREAL_PYTHON", raising=False)
    with pytest.raises(ConfigError, match="QUEUE_ROLLOUT_AREAL_PYTHON"):
        areal_python()
    monkeypatch.setenv("QUEUE_ROLLOUT_AREAL_PYTHON", sys.executable)  # no AReaL here
    with pytest.raises(ConfigError, match="cannot import AReaL's remote SGLang engine"):
        areal_python()


def test_the_full_bench_needs_a_model_for_its_real_setting(monkeypatch, tmp_path):
    monkeypatch.setattr("queue_rollout.lab.bench.peer_areal.areal_python", lambda: "python")
    with pytest.raises(ConfigError, match="--model"):
        run_peer_areal(tmp_path / "work")


def test_each_group_gets_prompt_ids_of_its_own_the_same_every_time():
    shape = Shape(prompts=1_000)
    prompts = peer_prompts(PILOTS["long-tail"], shape, Scale())
    assert prompts == peer_prompts(PILOTS["long-tail"], shape, Scale())
    assert len({p["input_ids"][0] for p in prompts}) == 1_000  # what the logs tell apart
    heads = {tuple(p["input_ids"]) for p in prompts}
    assert len(heads) == 1_000 and all(len(h) == PROMPT_TOKENS for h in heads)
    assert all(50 <= t < 1950 for h in heads for t in h)  # within any model's vocabulary
    assert all("prompt" not in p and len(p["member_lengths"]) == 8 for p in prompts)


def _report(lengths: dict[str, list[int]]) -> dict:
    """AReaL's OUT for two batches of one group each, the first trained on."""
    groups = list(lengths)
    return {"started_at": 100.0, "seconds": 3.0, "cpu_s": 0.5,
            "batches": [{"index": 0, "ready": 1.0, "paused": 1.5, "resumed": 1.75,
                         "groups": [{"group": groups[0], "index": 0, "done": 50.0,
                                     "lengths": lengths[groups[0]]}]},
                        {"index": 1, "ready": 3.0,
                         "groups": [{"group": groups[1], "index": 1, "done": 52.0,
                                     "lengths": lengths[groups[1]]}]}],
            "episodes": [{"group": g, "member": m, "sent": 40.0 + m, "delivered": 51.0}
                         for g in groups for m in range(len(lengths[g]))]}


def test_areals_report_is_a_run_the_audit_holds_to_the_manifest():
    prompts = [{"id": "a", "input_ids": [1], "member_lengths": [3, 5]},
               {"id": "b", "input_ids": [2], "member_lengths": [4, 4]}]
    shape = Shape(prompts=2, group_size=2, batch_size=1, replicas=1, slots_per_replica=4)
    run = areal_run(_report({"a": [3, 5], "b": [4, 4]}), prompts, shape)
    assert run.ready == [1.0, 3.0] and run.pauses == [(1.5, 1.75)]
    assert run.mean_pause_s == 0.25 and run.accepted_at == {"a": 50.0, "b": 52.0}
    assert run.sent[("a", 1)] == 41.0 and run.delivered_at["b"] == 51.0
    # a cut-short call went on as a second request: allowed, its tokens made once
    run.engine_counters = {"requests": 5, "generation_tokens": 16}
    assert audit(prompts, [run], request_logs=False, resumed=True) == []
    assert audit(prompts, [run], request_logs=False) == [
        "areal mode: the replicas ran 5 requests for 4 model calls"]
    run.engine_counters = {"requests": 3, "generation_tokens": 16}
    assert audit(prompts, [run], request_logs=False, resumed=True) == [
        "areal mode: the replicas ran 3 requests for 4 model calls"]
    short = areal_run(_report({"a": [3, 4], "b": [4, 4]}), prompts, shape)
    short.engine_counters = {"requests": 4, "generation_tokens": 15}
    assert audit(prompts, [short], request_logs=False, resumed=True) == [
        "areal mode: group a members produced [3, 4], expected [3, 5]"]


@pytest.mark.bench
def test_the_small_version_runs_the_three_contenders_audited(areal_python, tmp_path,
                                                             monkeypatch):
    """``bench --profile peer-areal --small``: AReaL's engine and both farm modes over
    the same 32 groups on simulated replicas, every run audited (it raises otherwise),
    then the control plane's price."""
    monkeypatch.setenv("QUEUE_ROLLOUT_AREAL_PYTHON", areal_python)
    result = run_peer_areal(Path(tmp_path) / "work", small=True)
    (sim,) = result["settings"]
    (workload,) = sim["workloads"]
    for contender in CONTENDERS:
        figures = workload["contenders"][contender]
        assert set(figures) == set(FIGURES)
        assert figures["all_work_s"]["median"] > 0
        assert figures["mean_update_pause_s"]["median"] > 0  # one training batch
        assert figures["requests_per_episode"]["median"] >= 1
    price = sim["control_plane"]
    assert (price["busy"]["episodes"], price["busy"]["groups_in_flight"]) == (32 * 8, 16)
    assert (price["alone"]["episodes"], price["alone"]["groups_in_flight"]) == (16 * 8, 1)
    for side in ("areal", "farm"):
        for p in (price["busy"][side], price["alone"][side]):
            assert p["episodes_per_s"] > 0 and p["cpu_ms_per_episode"] > 0
            assert p["ready_ms_p99"] >= p["ready_ms_p50"]
            assert p["delivered_ms_p50"] >= p["ready_ms_p50"]
