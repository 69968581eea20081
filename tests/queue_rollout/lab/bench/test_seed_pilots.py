"""The seed's workload pilots: a small multi-turn pilot with rolling consumption through
the real stack (audited per call), the calibration block, and the sensitivity runs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from queue_rollout.engines.base import episode_seed, turn_rid
from queue_rollout.lab.bench.audit import audit
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import open_bench, run_pilot
from queue_rollout.lab.bench.seed_pilots import calibration_achieved
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.agentic import AgenticParams, agentic_manifest
from queue_rollout.lab.workloads.seed import swe_profile

# -- a small multi-turn pilot through the real stack -------------------------------------

TINY = AgenticParams(turns_median=3, turns_sigma=0.4, max_turns=6, difficulty_sigma=0.3,
                     gen_median=96, gen_min=16, gen_max=256, tool_median_s=1.0,
                     tool_sigma=0.5, tool_max_s=3.0, tool_tokens_median=64,
                     tool_tokens_max=256, harness_share=0.1)
SMALL = Shape(prompts=10, group_size=4, batch_size=2, replicas=2, slots_per_replica=4,
              train_s=0.0, train_batches=0, stop_after=3)
FAST = Scale(time=0.05, tokens=0.25)


@pytest.fixture(scope="module")
def small_swe(tmp_path_factory, redis_server):
    profile = dataclasses.replace(swe_profile(), turns=lambda n, g: agentic_manifest(n, g, TINY),
                                  prompt_tokens=256, shape=SMALL, scale=FAST)
    bench = open_bench(tmp_path_factory.mktemp("swe"), SMALL, FAST, redis_server.url,
                       lambda line: None)
    try:
        result, runs = run_pilot(bench, profile, max_staleness=2)  # raises on a bad audit
    finally:
        bench.stop()
    return profile, result, runs


@pytest.mark.bench
def test_a_small_agentic_pilot_rolls_to_its_batch_and_passes_the_per_call_audit(small_swe):
    _profile, result, runs = small_swe
    assert result["seed"]["group"]["accepted_groups_per_hour"] == 73.82
    assert result["shape"]["stop_after"] == 3
    for mode in ("group", "sample"):
        run, m = runs[mode], result["modes"][mode]
        assert len(run.ready) == 3 and not run.pauses  # rolling: no training pause
        assert len(run.delivered) == 6
        # active episodes from the ledger (tool waits included) exceed running requests
        assert m["mean_active_episodes"] > m["mean_running_requests"] > 0
        assert m["batches_ready_s"] == m["all_work_completion_s"] == pytest.approx(
            run.ready[-1], abs=1e-3)
        assert m["accepted_groups_per_hour"] == pytest.approx(2 * 2 / (run.ready[2] - run.ready[0])
                                                              * 3600, rel=1e-3)
        assert m["ideal"]["first_batch_s"] > 0  # the ideal schedule: virtual time
        assert m["ideal_ratio"] == pytest.approx(
            m["all_work_completion_s"] / m["ideal"]["all_work_completion_s"], abs=0.01)
        assert 0 < m["ideal"]["gpu_busy"] <= 1
    json.dumps(result)


@pytest.mark.bench
def test_the_per_call_audit_names_a_lost_or_wrong_call(small_swe):
    profile, _, runs = small_swe
    assert profile.shape and profile.scale
    prompts = profile.manifest(profile.shape, profile.scale)
    assert audit(prompts, [runs["group"]], complete=False) == []
    run = runs["group"]
    gid = next(iter(run.delivered))
    seed = episode_seed(0, gid, 0)
    first = next(r for r in run.requests if r["seed"] == seed)
    second = dataclasses.replace(run, requests=[dict(r, tokens=r["tokens"] + 1)
                                                if r is first else r for r in run.requests])
    assert any(f"group {gid} member 0 call 0: {first['tokens'] + 1} tokens" in p
               for p in audit(prompts, [second], complete=False))
    lost = dataclasses.replace(run, requests=[r for r in run.requests if r is not first])
    assert any(f"group {gid} member 0 call 0: 0 requests" in p
               for p in audit(prompts, [lost], complete=False))
    # a later call whose rid is not its attempt's turn rid
    later = next(r for r in run.requests if r["rid"].endswith("-t001")
                 and any(r["seed"] == episode_seed(episode_seed(0, g, m), "turn", 1)
                         for g in run.delivered for m in range(4)))
    renamed = dataclasses.replace(run, requests=[
        dict(r, rid=turn_rid("other", 1)) if r is later else r for r in run.requests])
    assert any("is not turn 1 of attempt" in p for p in audit(prompts, [renamed], complete=False))
    # everything was to be delivered: the groups still in flight are named
    assert any("groups not delivered" in p for p in audit(prompts, [run], complete=True))


@pytest.mark.bench
def test_the_calibration_block_reports_what_the_group_ideal_gives(small_swe):
    profile, _result, runs = small_swe
    assert profile.shape and profile.scale
    out = {"calibration": {"targets": {"accepted_groups_per_hour": 1.0,
                                       "mean_active_episodes": 1.0}}}
    calibration_achieved(out, runs["group"], profile, profile.shape, profile.scale)
    ideal = runs["group"].ideal
    assert ideal is not None
    achieved = out["calibration"]["achieved"]
    assert achieved["mean_active_episodes"] == pytest.approx(ideal.mean_in_flight, abs=1e-3)
    assert achieved["accepted_groups_per_hour"] == pytest.approx(
        ideal.steady_groups_per_hour(2) * FAST.time, rel=1e-3)
    assert out["calibration"]["worst_error"] == pytest.approx(
        max(abs(achieved[k] - 1) for k in achieved), abs=1e-3)


def test_a_mode_run_without_pauses_counts_groups_per_hour_first_to_last_batch():
    run = ModeRun("group", slots=8, ready=[10.0, 20.0, 40.0], batch_size=4)
    assert run.accepted_groups_per_hour == pytest.approx(2 * 4 / 30 * 3600)
    assert run.median_batch_interval == pytest.approx(15.0)


@pytest.mark.bench
def test_sensitivity_changes_one_choice_at_a_time_in_the_ideal_schedule(redis_server, tmp_path):
    from queue_rollout.lab.bench.seed_pilots import sensitivity
    from queue_rollout.lab.workloads.seed import BOBA_SCALE

    lines: list[str] = []
    rows = sensitivity("boba-math-b8", redis_server.url, BOBA_SCALE, 2, tmp_path, lines.append)
    assert [r["choice"] for r in rows][:2] == ["groups alike (difficulty sigma 0.1)",
                                               "groups differ more (difficulty sigma 0.5)"]
    for row in rows:
        for mode in ("group", "sample"):
            assert row[mode]["mean_rollout_interval_s"] > 0
        assert row["change"]["mean_rollout_interval_s"] == pytest.approx(
            row["sample"]["mean_rollout_interval_s"] / row["group"]["mean_rollout_interval_s"] - 1,
            abs=1e-3)
    pools = {r["choice"]: r["group"]["all_work_completion_s"] for r in rows}
    # a quarter of the KV room makes the same work slower
    assert pools["KV pool 110,000 tokens"] > pools["KV pool 440,000 tokens"]
    assert len(lines) == len(rows)


def test_refit_is_refused_for_a_profile_without_a_calibration(capsys):
    from queue_rollout.cli.main import main

    assert main(["bench", "--profile", "long-tail", "--refit"]) == 2
    assert "long-tail has no calibration to fit" in capsys.readouterr().err


def test_a_refit_on_the_h200_runs_group_admission_on_the_h200s_constants(
        redis_server, tmp_path, monkeypatch):
    from queue_rollout.lab.bench import seed_pilots
    from queue_rollout.lab.bench.fit import Fit
    from queue_rollout.lab.bench.pilot import Bench
    from queue_rollout.lab.virtual.hardware import H200
    from queue_rollout.lab.workloads.seed import BOBA_PARAMS_H200, boba_profile

    def one_evaluation(evaluate, start, targets, **_):  # the fit's first look, no search
        return Fit(dict(start), evaluate({}), dict(targets), evaluations=1)

    monkeypatch.setattr(seed_pilots, "fit", one_evaluation)
    result = seed_pilots.refit("boba-math", redis_server.url, tmp_path / "fit",
                               lambda line: None, engine=H200)
    assert result["engine"] == "h200"
    assert result["fitted"] == {"median": BOBA_PARAMS_H200.median,
                                "member_sigma": BOBA_PARAMS_H200.member_sigma}
    profile = boba_profile(params=BOBA_PARAMS_H200)
    for shape, same in ((H200.shape(profile.shape), True), (profile.shape, False)):
        bench = Bench(redis_server.url, shape, profile.scale, tmp_path / str(same))
        prompts = profile.manifest(shape, profile.scale)
        report = bench.ideal(prompts, "group", shape.max_staleness, "check")
        figures = seed_pilots.baseline_figures(report, prompts, shape, profile.scale)
        interval = result["figures"]["mean_rollout_interval_s"]
        assert (interval == pytest.approx(figures["mean_rollout_interval_s"])) is same
