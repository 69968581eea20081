"""The real-sglang bench's parts that need no server: its workloads, the calibration
from SGLang's decode lines, the figures and the audit on the replicas' counters."""

from __future__ import annotations

import pytest
from real_engine.server import STAND_IN, STAND_IN_LOG_ENV, model

from queue_rollout.engines.concurrency import metric_totals
from queue_rollout.lab.bench.audit import audit
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.real_sglang import (
    _DECODE,
    calibrate,
    equal,
    long_tail,
    profile_json,
    profiles,
    real_shape,
    run_real_sglang,
    spread,
)

#: A decode line as SGLang 0.5.23 logs it.
LINE = ("[2026-12-02 15:38:36] Decode batch, #running-req: 16, #token: 6040, token usage: "
        "0.09, cpu graph: False, gen throughput (token/s): 848.11, #queue-req: 0")


def test_the_long_tail_has_one_member_eight_times_longer_rotating_and_equal_the_same_tokens():
    lt, eq = long_tail(100)(8, 4), equal(100)(8, 4)
    assert len(lt) == len(eq) == 8
    for i, lengths in enumerate(lt.values()):
        assert sorted(lengths) == [100, 100, 100, 800] and lengths.index(800) == i % 4
    assert all(lengths == [275] * 4 for lengths in eq.values())
    assert {sum(v) for v in lt.values()} == {sum(v) for v in eq.values()} == {1100}


def test_a_decode_line_is_read_and_the_step_recovered_from_lines_of_a_known_step():
    assert {k: float(v) for k, v in _DECODE.search(LINE).groupdict().items()} == {
        "running": 16.0, "tokens": 6040.0, "throughput": 848.11}
    step = (5.0, 0.6, 1.5)  # ms, ms per request, us per context token

    def line(n: int, t: int) -> dict[str, float]:
        ms = step[0] + step[1] * n + step[2] * t / 1000
        return {"running": n, "tokens": t, "throughput": 1000 * n / ms}

    lines = [line(n, t) for n in (1, 2, 4, 8) for t in (100 * n, 2000 * n)]
    fitted = calibrate(lines)
    assert fitted["step_ms"] == pytest.approx(5.0, rel=1e-3)
    assert fitted["step_ms_per_request"] == pytest.approx(0.6, rel=1e-3)
    assert fitted["step_us_per_context_token"] == pytest.approx(1.5, rel=1e-3)
    assert fitted["lines"] == 8 and fitted["median_relative_error"] < 1e-3


def test_a_coefficient_the_fit_makes_negative_is_dropped_and_the_rest_fitted_again():
    # the step shrinks with context here: no cost can be negative, so that term goes
    lines = [{"running": n, "tokens": t, "throughput": 1000 * n / (4.0 + 1.0 * n - t / 1000)}
             for n in (1, 2, 4) for t in (100, 1500)]
    fitted = calibrate(lines)
    assert fitted["step_us_per_context_token"] == 0.0
    assert fitted["step_ms"] > 0 and fitted["step_ms_per_request"] > 0
    with pytest.raises(Exception, match="too few"):
        calibrate(lines[:2])


def test_metric_totals_add_up_every_series_of_a_name():
    text = ('# HELP sglang:num_requests_total x\nsglang:num_requests_total{tp="0"} 3.0\n'
            'sglang:num_requests_total{tp="1"} 4.0\nsglang_generation_tokens_total 70\n'
            "other_metric 5\n")
    assert metric_totals(text) == {"sglang:num_requests_total": 7.0,
                                   "sglang:generation_tokens_total": 70.0}


def real_run(mode: str, prompts: list[dict], *, requests: float, tokens: float,
             ready: list[float]) -> ModeRun:
    run = ModeRun(mode, 16, batch_size=4, ready=ready, pauses=[(ready[0], ready[0] + 1)],
                  counters={"finished": sum(len(p["member_lengths"]) for p in prompts)})
    for p in prompts:
        run.delivered[p["id"]] = list(p["member_lengths"])
        run.delivered_turns[p["id"]] = [[n] for n in p["member_lengths"]]
        run.delivered_prompts.append(p)
    run.engine_counters = {"requests": requests, "generation_tokens": tokens, "retractions": 0}
    run.served = [(0.0, 8), (ready[0], 4), (ready[0] + 1, 2)]
    return run


def test_the_audit_on_real_replicas_checks_their_counters_instead_of_request_logs():
    prompts = [{"id": f"p{i}", "prompt": "x", "member_lengths": [10, 20]} for i in range(2)]
    sound = real_run("group", prompts, requests=4, tokens=60, ready=[5.0, 9.0])
    assert audit(prompts, [sound], request_logs=False) == []
    twice = real_run("sample", prompts, requests=5, tokens=70, ready=[5.0, 9.0])
    assert audit(prompts, [twice], request_logs=False) == [
        "sample mode: the replicas ran 5 requests for 4 model calls",
        "sample mode: the replicas generated 70 tokens, the results hold 60"]
    duplicated = real_run("group", prompts, requests=4, tokens=60, ready=[5.0, 9.0])
    duplicated.delivered_prompts.append(prompts[0])
    assert any("differ from the manifest" in p
               for p in audit(prompts, [duplicated], request_logs=False))


def test_active_episodes_come_from_the_replicas_samples_outside_the_pauses():
    prompts = [{"id": "p0", "prompt": "x", "member_lengths": [10]}]
    run = real_run("group", prompts, requests=1, tokens=10, ready=[4.0, 8.0])
    # 8 running for 4 s, a pause (4-5 s) with 4, then 2 running until 8 s
    assert run.mean_active == pytest.approx((8 * 4 + 2 * 3) / 7)


def test_the_figures_take_the_median_of_the_repeats_and_set_the_prediction_beside():
    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0,
                                            "runs": [3.0, None, 1.0, 2.0]}
    prompts = [{"id": "p0", "prompt": "x", "member_lengths": [10]}]
    runs = {"group": [real_run("group", prompts, requests=1, tokens=10, ready=[r, 2 * r])
                      for r in (10.0, 12.0, 11.0)],
            "sample": [real_run("sample", prompts, requests=1, tokens=10, ready=[r, 2 * r])
                       for r in (8.0, 9.0, 7.0)]}
    predicted = {"group": {"mean_rollout_interval_s": 10.0, "all_work_completion_s": 20.0,
                           "mean_active_episodes": 4.0},
                 "sample": {"mean_rollout_interval_s": 7.0, "all_work_completion_s": 15.0,
                            "mean_active_episodes": 6.0}}
    for mode in predicted.values():
        mode["retractions"] = 0
    out = profile_json(profiles(100)[0], real_shape(), runs, predicted)
    assert out["variants"]["group"]["all_work_completion_s"]["median"] == 22.0
    assert out["variants"]["sample"]["all_work_completion_s"]["median"] == 16.0
    assert out["change"]["retractions"] is None  # none in either: no share of nothing
    assert out["change"]["all_work_completion_s"] == pytest.approx(16 / 22 - 1, abs=1e-4)
    assert out["predicted_change"]["all_work_completion_s"] == -0.25
    assert out["difference_pp"]["all_work_completion_s"] == pytest.approx(
        round(100 * (-0.25 - (16 / 22 - 1)), 1))




def test_lines_whose_interval_held_idle_time_are_left_out_of_the_fit():
    def line(n: int, t: int, idle_ms: float = 0.0) -> dict[str, float]:
        ms = 5.0 + 0.6 * n + 1.5 * t / 1000 + idle_ms / 10  # idle spread over 10 steps
        return {"running": n, "tokens": t, "throughput": 1000 * n / ms}

    lines = [line(n, t) for n in (1, 2, 4, 8) for t in (100 * n, 2000 * n)]
    lines += [line(8, 400, idle_ms=5000), line(2, 300, idle_ms=800)]
    fitted = calibrate(lines)
    assert fitted["lines_left_out"] == 2 and fitted["lines"] == 8
    assert fitted["step_ms"] == pytest.approx(5.0, rel=1e-3)
    assert fitted["step_us_per_context_token"] == pytest.approx(1.5, rel=1e-3)


@pytest.mark.sglang
def test_the_real_bench_runs_both_modes_on_real_replicas_audited_and_predicted(
        sglang_interpreter, tmp_path, monkeypatch):
    """A small run of ``bench --profile real-sglang`` on two real servers: every run
    audited on the replicas' own counters (it raises otherwise), the decode step fitted
    to the group runs' log lines, both modes predicted; the sgl_kernel stand-in never
    called."""
    calls = tmp_path / "stand-in-calls.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(STAND_IN))
    monkeypatch.setenv(STAND_IN_LOG_ENV, str(calls))
    result = run_real_sglang(model(sglang_interpreter, 0), sglang_interpreter,
                             tmp_path / "bench", repeats=1, short=24, prompts=4)
    assert not calls.exists(), calls.read_text()
    assert [w["profile"] for w in result["workloads"]] == ["long-tail", "equal"]
    for w in result["workloads"]:
        c = w["calibration"]
        assert c["lines"] >= 3 and c["step_ms"] + c["step_ms_per_request"] > 0
        for name in ("group", "sample"):
            assert w["variants"][name]["all_work_completion_s"]["median"] > 0
            assert w["predicted"][name]["all_work_completion_s"] > 0
            assert w["variants"][name]["retractions"]["median"] == 0  # a pool none fills
        assert w["change"]["all_work_completion_s"] is not None
