"""examples/learning_stats.py: the statistics the learning studies report, against
values known in closed form; examples/learning_report.py's tables from them."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str) -> ModuleType:
    """examples/NAME.py as the module *name* (registered: its dataclasses, and the
    report's import of the statistics, look it up)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stats() -> Iterator[ModuleType]:
    try:
        yield load("learning_stats")
    finally:
        sys.modules.pop("learning_stats", None)


@pytest.fixture(scope="module")
def report(stats: ModuleType) -> Iterator[ModuleType]:
    sys.path.insert(0, str(EXAMPLES))  # the report reads the task from grpo_tiny
    try:
        yield load("learning_report")
    finally:
        sys.modules.pop("learning_report", None)
        sys.modules.pop("grpo_tiny", None)
        sys.path.remove(str(EXAMPLES))


def test_take_off_is_the_first_step_whose_trailing_mean_reaches_the_threshold(stats):
    assert stats.take_off([0.1, 0.2, 0.9, 0.9, 0.9]) == 4  # (0.1+0.2+0.9+0.9)/4 = 0.525
    assert stats.take_off([0.6]) == 1  # fewer than five steps at the start
    assert stats.take_off([0.0] * 5 + [1.0] * 3) == 8  # steps 4-8: 3/5; 3-7: 2/5
    assert stats.take_off([0.0] * 5 + [1.0] * 2) is None
    assert stats.take_off([0.4] * 80) is None  # censored


def test_clopper_pearson_meets_its_closed_forms_at_the_ends(stats):
    low, high = stats.clopper_pearson(0, 16)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 16), abs=1e-9)
    low, high = stats.clopper_pearson(16, 16)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 16), abs=1e-9)
    low, high = stats.clopper_pearson(8, 16)
    assert low == pytest.approx(1 - high, abs=1e-9) and 0.24 < low < 0.25
    with pytest.raises(ValueError):
        stats.clopper_pearson(3, 2)


def test_chi2_sf_meets_its_closed_forms(stats):
    for x in (0.1, 1.0, 3.841, 10.0, 40.0):
        assert stats.chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)
        assert stats.chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
    assert stats.chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-4)
    assert stats.chi2_sf(0.0, 3) == 1.0


def test_two_samples_of_one_distribution_pass_and_of_two_fail(stats):
    same = stats.chi2_two_sample(["a"] * 50 + ["b"] * 50, ["b"] * 50 + ["a"] * 50)
    assert same.statistic == 0.0 and same.p_value == 1.0 and same.df == 1
    apart = stats.chi2_two_sample(["a"] * 80 + ["b"] * 20, ["a"] * 50 + ["b"] * 50)
    assert apart.p_value < 1e-4
    # answers expected fewer than 5 times are pooled into one category
    pooled = stats.chi2_two_sample(["a"] * 50 + ["x", "y"], ["a"] * 50 + ["z"])
    assert pooled.categories == ["'a'", "other"] and pooled.df == 1


def test_logrank_and_kaplan_meier(stats):
    early = [5, 6, 7, 8, 9, 10, 11, 12]
    assert stats.logrank(early, early, 80) == (0.0, 1.0)
    chi2, p = stats.logrank(early, [None] * 8, 80)
    assert chi2 > 10 and p < 0.01
    assert stats.km_median(early, 80) == 8  # half taken off by step 8
    assert stats.km_median([5, None, None, None], 80) is None
    # a censored run leaves the risk set: 3 of 4 at risk at step 10, one takes off
    assert stats.kaplan_meier([5, 10, None, None], 80) == [(5, 0.75), (10, 0.5)]


def test_the_detectable_differences_shrink_with_more_runs(stats):
    small = stats.detectable_share_difference(8, 8, 0.5)
    large = stats.detectable_share_difference(64, 64, 0.5)
    assert 0 < large < small <= 1.0
    assert stats.detectable_share_difference(2, 2, 0.5) == 1.0  # nothing is detectable
    # Schoenfeld: log HR = 2 (z_a + z_b) / sqrt(events)
    assert stats.detectable_hazard_ratio(16) == pytest.approx(
        math.exp(2 * (1.959964 + 0.841621) / 4), rel=1e-5)
    assert stats.detectable_hazard_ratio(0) == math.inf


def test_icc_is_one_for_identical_members_minus_one_for_opposed_and_near_zero_at_random(
        stats):
    assert stats.icc([[1, 1], [0, 0], [1, 1]]) == 1.0
    assert stats.icc([[1, 0], [0, 1], [1, 0]]) == -1.0
    rng = random.Random(3)
    groups = [[rng.random() for _ in range(16)] for _ in range(125)]
    low, high = stats.icc_interval(groups, rounds=300)
    assert low < 0 < high and abs(stats.icc(groups)) < 0.05
    mean, se = stats.mean_se([1.0, 2.0, 3.0])
    assert (mean, se) == (2.0, pytest.approx(1 / math.sqrt(3)))


def run(arm: str, seed: int, jump: int | None, step_s: float = 2.0) -> dict[str, object]:
    """A study's line: chance until step *jump*, then 0.95; smoothed over 5 steps that
    passes 0.5 at *jump* + 2 (3 of 5 steps at 0.95) and 0.9 at *jump* + 4."""
    rewards = [0.12 if jump is None or i + 1 < jump else 0.95 for i in range(80)]
    return {"arm": arm, "seed": seed, "steps": 80, "eval_before": 0.125,
            "eval_after": 0.125 if jump is None else 1.0, "wall_s": 80 * step_s,
            "rewards": rewards, "kl": [1e-3] * 80,
            "at_s": [step_s * (i + 1) for i in range(80)],
            "take_off": None if jump is None else jump + 2}


def test_the_report_tables_each_run_each_arm_and_each_pair(report, stats):
    runs = ([run("a", s, t) for s, t in enumerate([10, 20, 30, None])]
            + [run("b", s, None) for s in range(4)])
    for r in runs:  # the driver's take-off is the statistics' own
        assert r["take_off"] == stats.take_off(r["rewards"])
    text = report.report(runs, [("a", "b")])
    assert "| a | 0 | 12 | 1.000 |" in text
    a = report.arm_rows([r for r in runs if r["arm"] == "a"])
    assert (a["took_off"], a["km_median"]) == (3, 22)
    assert a["interval"] == pytest.approx(stats.clopper_pearson(3, 4))
    assert report.time_to(runs[0]) == 2.0 * (10 + 4) and report.time_to(runs[3]) is None
    assert a["time_median"] == 2.0 * (20 + 4)
    chi2, p = stats.logrank([12, 22, 32, None], [None] * 4, 80)
    assert f"| a against b | {chi2:.2f} | {p:.3f} |" in text
    assert "| b | 4 | 0 | 0.00 (0.00-0.60) | not reached |" in text


def test_the_order_report_finds_which_prompts_the_trainer_got(report):
    grpo = sys.modules["grpo_tiny"]
    prompts = grpo.task_prompts(12, 5 + 1, "train-s5", 16)
    lengths = [sum(p["lengths"]) / 16 for p in prompts]
    ids = [p["id"] for p in prompts]
    # consumed: every group without a long member first, then those with; 4 a step
    order = ([i for i, n in zip(ids, lengths, strict=True) if n == grpo.ANSWER_TOKENS]
             + [i for i, n in zip(ids, lengths, strict=True) if n > grpo.ANSWER_TOKENS])[:8]
    line = {"arm": "x", "seed": 5, "submitted": 12, "groups": [order[:4], order[4:]],
            "group_rewards": [[0.5] * 4, [0.25] * 4], "got_s": [3.0, 7.0]}
    row = report.order_rows(line)
    assert row["consumed"] == 8 and row["reward"] == [0.5] * 4 + [0.25] * 4
    assert row["length_submitted"] == lengths
    assert row["length_consumed"] == [lengths[ids.index(g)] for g in order]
    assert row["delay"] == [3.0] * 4 + [7.0] * 4
    assert row["length_delay_tau"] == report.kendall_tau(row["length_consumed"], row["delay"])
    assert row["from_first"] == sum(g in ids[:8] for g in order)
    assert row["tau"] == report.kendall_tau([ids.index(g) for g in order], list(range(8)))
    assert report.kendall_tau([1, 2, 3], [1, 2, 3]) == 1.0
    assert report.kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    text = report.order_report([line, {**line, "seed": 5}])
    assert "| x | 2 | 8 of 12 |" in text
    assert f"| {report.interval(row['length_consumed'] * 2)} |" in text
    assert "| 0.38 (0.31-0.44) |" in text  # rewards 0.5 and 0.25, 8 of each: SE 0.0323
    assert "| 5.0 / 7.0 |" in text  # the delays' median and 90th percentile
    with pytest.raises(ValueError):
        report.interval([1.0])
