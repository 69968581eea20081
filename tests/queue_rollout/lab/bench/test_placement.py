"""The long-prompt profile: ``rollout.placement = "group"`` against ``"any"``, in the
ideal schedule at the profile's own shape and through a small real stack."""

from __future__ import annotations

import json

import pytest

from queue_rollout.lab.bench.pilot import open_bench
from queue_rollout.lab.bench.placement import run_long_prompt
from queue_rollout.lab.bench.report import placement_markdown, placement_text
from queue_rollout.lab.virtual.ideal import ideal_schedule
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import LONG_PROMPT, PILOTS
from queue_rollout.ledger.connection import connect

SMALL = Shape(prompts=8, group_size=4, batch_size=2, replicas=2, slots_per_replica=4,
              train_s=0.5, train_batches=2)
FAST = Scale(time=0.02, tokens=1 / 32)


@pytest.fixture(scope="module")
def ideal(redis_server):
    """(mode, placement) -> the ideal schedule of long-prompt at its own shape."""
    shape, scale = Shape(), Scale()
    prompts = LONG_PROMPT.manifest(shape, scale)
    client = connect(redis_server.url)
    try:
        return {(mode, placement): ideal_schedule(client, shape, scale, prompts, mode, 2,
                                                  f"lp-{mode}-{placement}",
                                                  placement=placement)
                for mode in ("group", "sample") for placement in ("any", "group")}
    finally:
        client.close()


def computations(report) -> float:
    """Prompts' worth of prefill computed per group."""
    return report.prefill_tokens / 128 / Scale().length(LONG_PROMPT.prompt_tokens)


def test_placed_groups_compute_their_prompt_at_most_twice_against_eight_times(ideal):
    any_, placed = ideal[("group", "any")], ideal[("group", "group")]
    assert computations(any_) == pytest.approx(8.0)  # every member on a replica of its own
    assert computations(placed) <= 2.0
    assert placed.placements == {"one_replica": 128, "split": 0}
    assert placed.mean_rollout_interval <= any_.mean_rollout_interval
    assert placed.cached_tokens > any_.cached_tokens == 0


def test_refill_with_placement_computes_less_and_some_groups_are_split(ideal):
    any_, placed = ideal[("sample", "any")], ideal[("sample", "group")]
    assert computations(placed) < 0.5 * computations(any_)
    assert computations(placed) <= 2.0
    # refill frees slots one at a time: not every group finds G free slots on one replica
    assert placed.placements["split"] > 0
    assert sum(placed.placements.values()) == 128


@pytest.mark.parametrize("name", ["long-tail", "equal"])
@pytest.mark.bench
def test_placement_costs_short_prompts_at_most_two_percent(redis_server, name):
    shape, scale = Shape(), Scale()
    prompts = PILOTS[name].manifest(shape, scale)
    client = connect(redis_server.url)
    try:
        for mode in ("group", "sample"):
            any_, placed = (ideal_schedule(client, shape, scale, prompts, mode, 2,
                                           f"{name}-{mode}-{p}", placement=p)
                            for p in ("any", "group"))
            assert placed.mean_rollout_interval <= any_.mean_rollout_interval * 1.02, mode
            assert placed.all_work_s <= any_.all_work_s * 1.02, mode
    finally:
        client.close()


@pytest.mark.bench
def test_a_small_long_prompt_bench_runs_four_audited_runs(tmp_path, redis_server):
    bench = open_bench(tmp_path, SMALL, FAST, redis_server.url, lambda line: None)
    try:
        result, runs = run_long_prompt(bench, LONG_PROMPT, max_staleness=2)
    finally:
        bench.stop()
    assert list(result["runs"]) == ["group/any", "group/group", "sample/any", "sample/group"]
    prompt = FAST.length(LONG_PROMPT.prompt_tokens)
    assert result["shape"]["prompt_tokens"] == prompt
    for key, run in result["runs"].items():
        assert runs[key].counters["finished"] == 32
        computed = runs[key].counters["prefill:computed"]
        assert run["prefill_tokens_computed_per_group"] == pytest.approx(computed / 8, abs=0.1)
        assert run["ideal"]["prefill_tokens_computed_per_group"] > 0
        assert 0 <= run["cache_hit_rate"] <= 1
        placed = run["placements"]["one_replica"] + run["placements"]["split"]
        assert placed == (8 if key.endswith("/group") else 0)
    # on one replica a group's members find its prompt cached: at most two computed
    assert result["runs"]["group/group"]["prompt_computations_per_group"] <= 2.05
    assert result["runs"]["group/group"]["ideal"]["prompt_computations_per_group"] <= 2.0
    assert set(result["change"]) == {"group", "sample"}
    json.dumps(result)
    text, md = placement_text(result), placement_markdown(result)
    assert "prefill computed per group" in text and "| prefill computed per group" in md
