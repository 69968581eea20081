"""``queue-rollout plan``: the bench's ideal schedule per setting, the recommendation,
the headroom, and clear refusals of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queue_rollout.cli.main import main
from queue_rollout.lab.bench.main import BenchArgs, pilot_setting
from queue_rollout.lab.bench.pilot import Bench
from queue_rollout.lab.plan.main import PlanArgs, run, workload
from queue_rollout.lab.virtual.ideal import ideal_json
from queue_rollout.lab.workloads.registry import pilot_profile


def rows(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_at_a_profiles_shape_and_scale_plan_gives_the_bench_ideal_schedule(
        redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = PlanArgs(profile="mixed-tail", time_scale=0.1, token_scale=0.125,
                    max_staleness=(2,), json=True, live=False)
    assert run(args) == 0
    got = rows(capsys)
    shape, scale = pilot_setting(pilot_profile("mixed-tail"), BenchArgs("mixed-tail"))
    _, plan_shape, plan_scale, prompts = workload(args)
    assert (plan_shape, plan_scale) == (shape, scale)
    bench = Bench(redis_url, shape, scale, tmp_path)
    assert [r["mode"] for r in got] == ["group", "sample"]
    for row in got:
        ideal = ideal_json(bench.ideal(prompts, str(row["mode"]), 2, "agree"), shape, False)
        assert {k: row[k] for k in ideal} == ideal
        assert row["episodes"] == 128 * 8
        assert isinstance(row["ledger_commands_per_episode"], float)
        assert row["ledger_commands_per_episode"] > 0


def test_each_setting_is_a_row_and_the_recommendation_weighs_staleness(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--profile", "long-tail", "--gpus", "2", "--batch-size", "4",
                 "--batches", "4", "--max-staleness", "0,2", "--time-scale", "0.1",
                 "--token-scale", "0.125"])
    assert code == 0
    out = capsys.readouterr().out
    table, advice, redis_line = out.split("\n\n")[0], out.split("\n\n")[1].splitlines()[0], \
        out.split("\n\n")[1].splitlines()[1]
    assert len(table.splitlines()) == 1 + 4  # a header and (group, sample) x (0, 2)
    assert advice.startswith("recommendation: ")
    # the baseline is group admission at the configured window (2), listed or not first
    assert "against group admission at max_staleness 2" in advice or "keep group" in advice
    assert redis_line.startswith("Redis: ") and "headroom x" in redis_line


def test_json_rows_carry_staleness_and_headroom(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpus", "2", "--batch-size", "4", "--batches", "5",
                 "--max-staleness", "4", "--time-scale", "0.1", "--token-scale", "0.125",
                 "--json"]) == 0
    group, sample = rows(capsys)
    assert group["workload"] == "long-tail" and group["batches"] == 5
    for row in (group, sample):
        assert isinstance(row["mean_consumed_staleness"], float)
        assert 0 <= row["mean_consumed_staleness"] <= 4
        redis = row["redis"]
        assert isinstance(redis, dict) and redis["gpus"] == 2 and redis["headroom"] > 1
    # with room for 4 versions, refill runs ahead of the trainer: staler groups
    assert sample["mean_consumed_staleness"] > group["mean_consumed_staleness"]


def test_a_workload_file_plans_its_own_group_size(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps({"prompt_tokens": 64, "members": [
        {"output_tokens": n} for n in lengths]}) for lengths in ([100, 120, 900, 90],
                                                                  [300, 310, 290, 305])))
    assert main(["plan", "--workload", str(path), "--gpus", "1", "--slots-per-replica", "8",
                 "--batch-size", "2", "--batches", "3", "--json"]) == 0
    got = rows(capsys)
    assert {r["workload"] for r in got} == {str(path)}
    assert all(r["episodes"] == 3 * 2 * 4 for r in got)


@pytest.mark.parametrize(("argv", "says"), [
    (["--profile", "nope"], "invalid choice: 'nope'"),
    (["--gpus", "0"], "must be a positive integer"),
    (["--max-staleness", "1,x"], "not a comma-separated list"),
    (["--modes", "group,fast"], "unknown mode(s) fast"),
    (["--placement", "any,replica"], "unknown placement(s) replica"),
    (["--slots", "fixed,elastic"], "unknown slot setting(s) elastic"),
    (["--gpus", "1", "--slots-per-replica", "4"], "a group of 8 members does not fit "
                                                  "the farm's 4 slots"),
])
def test_bad_input_exits_2_with_a_message(argv: list[str], says: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["plan", *argv])
    except SystemExit as exc:  # argparse refuses before the command runs
        code = int(exc.code or 0)
    assert code == 2
    assert says in capsys.readouterr().err


def test_bad_workload_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty, bad = tmp_path / "empty.jsonl", tmp_path / "bad.jsonl"
    empty.write_text("")
    bad.write_text('{"members": [{"output_tokens": 5}]}\n{"members": [{"output_tokens": -1}]}\n')
    assert main(["plan", "--workload", str(empty)]) == 2
    assert "no group shapes" in capsys.readouterr().err
    assert main(["plan", "--workload", str(bad)]) == 2
    assert "line 2: member 0 output_tokens must be an integer >= 1" in capsys.readouterr().err
    assert main(["plan", "--workload", str(bad), "--profile", "equal"]) == 2
    assert main(["plan", "--redis-load", str(empty)]) == 2
    assert "--redis-load" in capsys.readouterr().err


def test_placement_settings_are_rows_with_the_prefill_they_compute(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--placement any,group on long prompts: a row each, and the table's placement
    columns; with groups on one replica a group computes its prompt about once."""
    assert main(["plan", "--profile", "long-prompt", "--gpus", "4", "--batch-size", "4",
                 "--batches", "4", "--modes", "group", "--placement", "any,group",
                 "--time-scale", "0.1", "--token-scale", "0.125", "--json"]) == 0
    any_, placed = rows(capsys)
    assert (any_["placement"], placed["placement"]) == ("any", "group")
    prompt = 512  # 4,096 tokens x 0.125
    assert any_["prefill_tokens_per_group"] > 3 * prompt  # members on 4 replicas
    assert placed["prefill_tokens_per_group"] <= 2 * prompt
    assert placed["cache_hit_rate"] > any_["cache_hit_rate"]
    assert main(["plan", "--profile", "long-prompt", "--gpus", "4", "--batch-size", "4",
                 "--batches", "4", "--modes", "group", "--placement", "any,group",
                 "--time-scale", "0.1", "--token-scale", "0.125"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:5] == ["mode", "stale", "placement", "prefill/group", "cache"]


@pytest.mark.bench
def test_slot_settings_are_rows_and_adaptive_limits_follow_a_full_pool(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--slots fixed,adaptive on kv-pressure under refill: a row each, the table's slot
    columns; the limits fall below the slots where the pools fill."""
    argv = ["plan", "--profile", "kv-pressure", "--modes", "sample", "--max-staleness", "7",
            "--slots", "fixed,adaptive", "--time-scale", "0.1", "--token-scale", "0.125"]
    assert main([*argv, "--json"]) == 0
    fixed, adaptive = rows(capsys)
    assert (fixed["slots"], adaptive["slots"]) == ("fixed", "adaptive")
    assert fixed["mean_slots_limit"] == 128 and fixed["retractions"] > 0
    assert adaptive["mean_slots_limit"] < 128
    assert adaptive["retractions"] <= fixed["retractions"]
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:5] == ["mode", "stale", "slots", "mean", "limit"]


@pytest.mark.timeout(120)
@pytest.mark.bench
def test_a_64_gpu_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpus", "64", "--batch-size", "64", "--batches", "6",
                 "--json"]) == 0
    group, sample = rows(capsys)
    for row in (group, sample):
        assert row["batches"] == 6 and row["episodes"] == 6 * 64 * 8
        redis = row["redis"]
        assert isinstance(redis, dict) and redis["gpus"] == 64
        assert redis["connections"] == round(64 * 4.02)  # the shipped redis-load figures
        assert 0 < redis["core_pct"] < 100


def test_out_writes_a_report_with_plots(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["plan", "--gpus", "2", "--batch-size", "4", "--batches", "3",
                 "--time-scale", "0.1", "--token-scale", "0.125", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = (out / "plan.md").read_text()
    advice = next(line for line in printed.splitlines() if line.startswith("recommendation"))
    assert advice in report and "| mode |" in report
    for name in ("plan-interval.png", "plan-staleness.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert len((out / "plan.jsonl").read_text().splitlines()) == 2
