"""The pilot benchmarks: the audit, the measures, a small run through the real stack and
the report. (The speed targets are benchmarks, not tests: docs/en/benchmarks.md.)"""

from __future__ import annotations

import dataclasses
import json

import pytest

from queue_rollout.engines.base import episode_seed
from queue_rollout.errors import InvariantViolation
from queue_rollout.lab.bench.audit import audit
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import open_bench, run_pilot, window_sweep
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import PILOTS

SMALL = Shape(prompts=8, group_size=4, batch_size=2, replicas=2, slots_per_replica=4,
              train_batches=2)
FAST = Scale(time=0.02, tokens=1 / 32)  # long-tail: 32 and 512 tokens; the long one ~2 s


# -- measures ---------------------------------------------------------------------------

def _request(rid: str, started: float, ended: float, tokens: int) -> dict:
    return {"rid": rid, "arrived": started, "started": started, "ended": ended,
            "tokens": tokens, "finish": "length"}


def test_mean_active_leaves_the_pause_windows_out():
    run = ModeRun("group", slots=4, ready=[2.0, 6.0], pauses=[(2.0, 4.0)])
    run.requests = [_request("a", 0.0, 6.0, 1), _request("b", 0.0, 2.0, 1),
                    _request("c", 4.0, 6.0, 1)]
    # generating: [0, 2) with 2 running, [4, 6) with 2 running; the pause [2, 4) is out
    assert run.mean_active == pytest.approx(2.0)
    assert run.active_timeline()[-1] == (6.0, 0)


def test_rollout_interval_and_accepted_rate_follow_the_definitions():
    run = ModeRun("sample", slots=8, ready=[1.0, 4.0, 8.0, 9.0],
                  pauses=[(1.0, 2.0), (4.0, 5.0), (8.0, 8.5)],
                  accepted_at_ready=[2, 5, 7, 8])
    # batch k from the end of batch k-1's pause: 4 - 2 and 8 - 5 (batch 4 was not trained)
    assert run.rollout_intervals == [2.0, 3.0, 0.5]
    assert run.mean_rollout_interval == pytest.approx(5.5 / 3)
    assert run.all_work_s == 9.0
    # from batch 1 ready to the last trained batch ready: (7 - 2) groups in 7 s
    assert run.accepted_groups_per_hour == pytest.approx(5 / 7 * 3600)


def _good_run(prompts: list[dict], mode: str = "group") -> ModeRun:
    run = ModeRun(mode, slots=4, ready=[1.0])
    run.delivered = {p["id"]: list(p["member_lengths"]) for p in prompts}
    run.delivered_turns = {p["id"]: [[n] for n in p["member_lengths"]] for p in prompts}
    run.delivered_prompts = list(prompts)
    run.requests = [dict(_request(f"{p['id']}-{m}", 0, 1, n), seed=episode_seed(0, p["id"], m))
                    for p in prompts for m, n in enumerate(p["member_lengths"])]
    run.counters = {"finished": sum(len(p["member_lengths"]) for p in prompts)}
    return run


def test_the_audit_passes_a_sound_run_and_names_every_problem():
    prompts = [{"id": "p0", "member_lengths": [3, 5]}, {"id": "p1", "member_lengths": [4, 4]}]
    assert audit(prompts, [_good_run(prompts)]) == []

    short = _good_run(prompts)
    short.delivered["p0"] = [3, 4]
    assert any("group p0 members produced [3, 4], expected [3, 5]" in p
               for p in audit(prompts, [short]))
    calls = _good_run(prompts)
    calls.delivered_turns["p1"] = [[4], [1, 3]]
    assert any("group p1 members' calls produced [[4], [1, 3]], expected [[4], [4]]" in p
               for p in audit(prompts, [calls]))

    twice = _good_run(prompts)
    twice.requests.append(dict(twice.requests[0]))
    problems = audit(prompts, [twice])
    assert any("an rid was sent to the replicas twice" in p for p in problems)
    assert any("ran 5 requests for 4 model calls" in p for p in problems)
    assert any("group p0 member 0 call 0: 2 requests in the replicas' logs" in p
               for p in problems)

    lost = _good_run(prompts, "sample")
    del lost.delivered["p1"]
    lost.delivered_prompts = prompts[:1]
    problems = audit(prompts, [lost])
    assert any("sample mode: 1 groups not delivered" in p for p in problems)
    assert not any("prompts delivered differ from the manifest" in p for p in problems)
    assert audit(prompts, [lost], complete=False) == []  # rolling: what was delivered

    wrong = _good_run(prompts)
    wrong.delivered_prompts = [dict(prompts[0], prompt="another"), prompts[1]]
    assert any("prompts delivered differ from the manifest" in p
               for p in audit(prompts, [wrong]))

    sick = _good_run(prompts)
    sick.doctor_problems = ["counter reserved is 1, the records say 0"]
    assert audit(prompts, [sick]) == ["group mode: doctor: counter reserved is 1, the "
                                      "records say 0"]


# -- the real stack ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_long_tail(tmp_path_factory, redis_server):
    lines: list[str] = []
    bench = open_bench(tmp_path_factory.mktemp("bench"), SMALL, FAST, redis_server.url,
                       lines.append)
    try:
        result, runs = run_pilot(bench, PILOTS["long-tail"], max_staleness=2)
        sweep = window_sweep(bench, PILOTS["long-tail"], windows=(0, 2))
    finally:
        bench.stop()
    return result, runs, sweep, lines


@pytest.mark.bench
def test_a_small_long_tail_pilot_runs_both_modes_through_the_stack(small_long_tail):
    result, runs, sweep, lines = small_long_tail
    assert result["profile"] == "long-tail"
    # the collector and the trainer's polling run at the shipped settings, scaled in time
    assert result["scale"] == {"time": 0.02, "tokens": 1 / 32, "collector_step_ms": 4.0,
                               "trainer_poll_s": 0.01}
    keys = {"mean_rollout_interval_s", "all_work_completion_s", "mean_active_episodes",
            "slot_occupancy", "ideal_ratio", "accepted_groups_per_hour", "output_tokens"}
    for mode in ("group", "sample"):
        m = result["modes"][mode]
        assert keys <= set(m) and keys <= set(result["change"])
        assert m["output_tokens"] == 8 * (3 * 32 + 512)  # every controlled length, exactly
        assert m["reference"]["output_tokens"] == 8 * (3 * 1024 + 16384)
        assert m["reference"]["all_work_completion_s"] == pytest.approx(
            m["all_work_completion_s"] / 0.02, rel=1e-3)
        assert 0 < m["slot_occupancy"] <= 1
        assert m["ideal_ratio"] == pytest.approx(
            m["all_work_completion_s"] / m["ideal"]["all_work_completion_s"], abs=0.01)
        assert m["ideal"]["all_work_completion_s"] > 0
        assert runs[mode].counters["finished"] == 32 and len(runs[mode].requests) == 32
    g, s = result["modes"]["group"], result["modes"]["sample"]
    assert result["change"]["mean_active_episodes"] == pytest.approx(
        s["mean_active_episodes"] / g["mean_active_episodes"] - 1, abs=1e-3)
    # refill keeps more slots busy on a long tail (a ratio within one run, not a timing)
    assert s["mean_active_episodes"] > g["mean_active_episodes"]
    assert any("long-tail sample: batch 4/4 ready" in line for line in lines)
    # completion order: every group delivered, the trained ones first
    for mode in ("group", "sample"):
        o = result["completion_order"][mode]
        assert o["groups_submitted"] == len(runs[mode].delivered) == SMALL.prompts
        assert o["groups_trained"] == min(SMALL.prompts, SMALL.train_batches * SMALL.batch_size)
        assert 0 <= o["trained_from_first_submitted"] <= o["groups_trained"]
        assert -1.0 <= o["order_tau"] <= 1.0
    from queue_rollout.lab.bench.report import pilot_text

    assert "completion order, sample: of the" in pilot_text(result)
    json.dumps(result)  # the --json line
    assert [row["max_staleness"] for row in sweep] == [0, 2]
    assert sweep[1]["sample"]["slot_occupancy"] > sweep[0]["sample"]["slot_occupancy"]


@pytest.mark.bench
def test_the_report_has_the_tables_and_png_plots(small_long_tail, tmp_path):
    pytest.importorskip("matplotlib")
    from queue_rollout.lab.bench.report import pilot_text, write_report

    result, runs, sweep, _ = small_long_tail
    path = write_report(tmp_path, [result], {"long-tail": runs}, {"long-tail": sweep},
                        "queue-rollout bench --profile long-tail --out x")
    text = path.read_text()
    assert "| mean rollout interval, b2-6 (s) |" in text and "`queue-rollout bench" in text
    for kind in ("active", "batches", "occupancy", "window"):
        png = tmp_path / f"long-tail-{kind}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", kind
        assert f"long-tail-{kind}.png" in text
    assert "ideal_ratio" in pilot_text(result)


def test_a_failed_audit_stops_the_bench(monkeypatch, tmp_path, redis_server):
    from queue_rollout.lab.bench import pilot

    monkeypatch.setattr(pilot, "audit", lambda *a, **k: ["group mode: made up"])
    monkeypatch.setattr(pilot.Bench, "run_mode", lambda self, *a: ModeRun(a[1], 4))
    bench = pilot.Bench(redis_server.url, SMALL, FAST, tmp_path)
    with pytest.raises(InvariantViolation, match="audit failed: group mode: made up"):
        run_pilot(bench, PILOTS["equal"], 2)


def test_ideal_schedules_of_two_benches_on_one_redis_stay_apart(redis_server, tmp_path):
    """Each bench (a shape and scale) counts its own runs: the same name from two of
    them must not reach one ledger (a rolling run leaves groups pending there, which the
    second would be handed)."""
    from queue_rollout.lab.bench.pilot import Bench

    shape = Shape(prompts=4, group_size=2, batch_size=2, replicas=1, slots_per_replica=2,
                  train_s=0.0, train_batches=0)
    a = Bench(redis_server.url, dataclasses.replace(shape, stop_after=1), FAST, tmp_path / "a")
    b = Bench(redis_server.url, shape, FAST, tmp_path / "b")
    first = [{"id": f"a-{i}", "prompt": "a", "member_lengths": [8, 16]} for i in range(4)]
    second = [{"id": f"b-{i}", "prompt": "b", "member_lengths": [4, 4]} for i in range(4)]
    assert a.ideal(first, "group", 2, "ideal-1").batches == 1  # groups left pending
    assert b.ideal(second, "group", 2, "ideal-1").output_tokens == 4 * 8
