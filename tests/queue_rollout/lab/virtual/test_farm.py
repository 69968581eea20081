"""The virtual-time farm under each pause mode: every group delivered with its exact
tokens; what each mode costs the replicas in prefill, from the engine model."""

from __future__ import annotations

import pytest

from queue_rollout.config import RolloutConfig
from queue_rollout.lab.sim.model import PauseMode
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.lab.virtual.farm import (
    AdaptiveSlots,
    EngineModel,
    SimFarm,
    SimReport,
    TrainerSchedule,
)
from queue_rollout.lab.workloads.pilots import long_tail_lengths
from queue_rollout.ledger.core import Ledger

GROUPS, G = 16, 4


def simulate(r, farm: str, pause_mode: PauseMode) -> tuple[SimFarm, SimReport]:
    clock = ManualClock()
    rollout = RolloutConfig(group_size=G, batch_size=2, max_concurrent_samples=8)
    ledger = Ledger(r, farm, rollout, clock=clock)
    sim = SimFarm(ledger, clock, long_tail_lengths(GROUPS, G, short=200, long=2000),
                  prompt_tokens={f"lt-{i:04d}": 300 for i in range(GROUPS)},
                  engine=EngineModel(replicas=2, slots_per_replica=4, step_ms=1.0,
                                     step_ms_per_request=0.0, prefill_tokens_per_s=10_000.0),
                  trainer=TrainerSchedule(train_s=1.0, train_batches=4,
                                          pause_mode=pause_mode),
                  capacity_slots=8)
    return sim, sim.run()


@pytest.fixture
def farms(r) -> dict[str, tuple[SimFarm, SimReport]]:
    return {mode: simulate(r, mode, mode) for mode in ("in_place", "abort", "retract")}


@pytest.fixture
def reports(farms) -> dict[str, SimReport]:
    return {mode: report for mode, (_, report) in farms.items()}


def test_every_pause_mode_delivers_every_group_with_its_tokens(reports):
    for report in reports.values():
        assert report.groups_accepted == GROUPS and report.batches == GROUPS // 2
        assert report.output_tokens == GROUPS * (3 * 200 + 2000)


def test_retract_recomputes_what_abort_finds_in_the_cache(farms, reports):
    in_place, abort, retract = (reports[m].prefill_tokens for m in ("in_place", "abort",
                                                                      "retract"))
    # in place: each prompt computed at most once a member (siblings on one replica share)
    assert in_place <= GROUPS * G * 300
    # abort: each continuation (prompt + output so far) finds it all cached but a token
    sim, _ = farms["abort"]
    resumed = [e for replica in sim.replicas for e in replica.log if e["prompt_tokens"] > 300]
    assert len(resumed) >= 4
    assert all(e["cached_tokens"] == e["prompt_tokens"] - 1 for e in resumed)
    # retract: the outputs running at each pause are computed again
    assert retract > max(in_place, abort) + 2000
    assert reports["retract"].all_work_s > reports["in_place"].all_work_s


def test_a_multi_turn_episode_holds_its_slot_through_tool_waits_and_reuses_its_context(r):
    """One episode alone: its time is each turn's prefill and decode plus its tool
    waits; each later turn computes only the tool's output (the rest is cached)."""
    clock = ManualClock()
    ledger = Ledger(r, "turns", RolloutConfig(group_size=1, batch_size=1,
                                              max_concurrent_samples=1), clock=clock)
    turns = [(100, 2.0, 50), (200, 1.0, 30), (50, 0.0, 0)]
    sim = SimFarm(ledger, clock, member_turns={"agent": [turns]},
                  prompt_tokens={"agent": 1000},
                  engine=EngineModel(replicas=1, slots_per_replica=1, step_ms=4.5,
                                     step_ms_per_request=0.2, prefill_tokens_per_s=20_000.0),
                  trainer=TrainerSchedule(train_s=1.0, train_batches=0))
    report = sim.run()
    step, prefill = (4.5 + 0.2) / 1000, (1000 + 50 + 30) / 20_000
    expected = prefill + 350 * step + 3.0
    assert report.all_work_s == pytest.approx(expected, abs=1e-9)
    assert report.output_tokens == 350 and report.prefill_tokens == 1080
    [replica] = sim.replicas
    assert [(e["prompt_tokens"], e["cached_tokens"]) for e in replica.log] == [
        (1000, 0), (1150, 1100), (1380, 1350)]
    assert ledger.counters()["turns"] == 3
    # the slot was held through the tool waits: in flight all along, generating less
    assert report.mean_in_flight == pytest.approx(1.0)
    assert report.mean_active == pytest.approx(350 * step / expected, abs=0.01)
    # the GPU is busy while it prefills or decodes, idle through the tool waits
    assert report.gpu_busy == pytest.approx((expected - 3.0) / expected, abs=1e-9)


def test_a_second_episode_waits_for_the_slot_a_tool_wait_holds(r):
    clock = ManualClock()
    ledger = Ledger(r, "turns2", RolloutConfig(group_size=2, batch_size=1,
                                               max_concurrent_samples=2), clock=clock)
    busy = [(10, 5.0, 1), (10, 0.0, 0)]
    sim = SimFarm(ledger, clock, member_turns={"g": [busy, busy]},
                  engine=EngineModel(replicas=1, slots_per_replica=1, step_ms=1.0,
                                     step_ms_per_request=0.0, prefill_tokens_per_s=1e9),
                  trainer=TrainerSchedule(train_s=1.0, train_batches=0))
    report = sim.run()
    assert report.all_work_s == pytest.approx(2 * (5.0 + 20 * 0.001), abs=1e-6)


def test_rolling_consumption_stops_when_the_asked_batch_is_ready(r):
    clock = ManualClock()
    ledger = Ledger(r, "rolling", RolloutConfig(group_size=2, batch_size=2,
                                                max_concurrent_samples=4, max_staleness=1),
                    clock=clock)
    lengths = {f"r{i}": [100 * (1 + i % 3), 100] for i in range(12)}
    sim = SimFarm(ledger, clock, lengths,
                  engine=EngineModel(replicas=1, slots_per_replica=4, step_ms=1.0,
                                     step_ms_per_request=0.0, prefill_tokens_per_s=1e9),
                  trainer=TrainerSchedule(train_s=1.0, train_batches=0, stop_after=3))
    report = sim.run()
    assert report.batches == 3 and ledger.version() == 3  # each consumed as it came
    assert sorted(report.ready_times) == report.ready_times and not report.pause_ends
    assert 6 <= report.groups_accepted < len(lengths)  # the rest was never waited for
    t = report.ready_times
    assert report.steady_groups_per_hour(2) == pytest.approx(2 * 2 / (t[2] - t[0]) * 3600)
    assert report.median_batch_interval == pytest.approx((t[2] - t[0]) / 2)  # of two gaps


def adaptive_run(r, farm: str, *, pool: int, floor: int | None,
                 placement: str = "any") -> tuple[SimFarm, SimReport]:
    """Sample mode with "auto" capacity over 2 replicas of 4 slots; four long (2,000
    tokens) members per group fill a pool of 4,000 tokens, not one of 100,000."""
    clock = ManualClock()
    rollout = RolloutConfig(group_size=G, batch_size=2, max_concurrent_samples="auto",
                            max_staleness=100, placement=placement)  # type: ignore[arg-type]
    ledger = Ledger(r, farm, rollout, clock=clock)
    lengths = {f"a{i:02d}": [2000 if i % 2 else 100] * G for i in range(8)}
    sim = SimFarm(ledger, clock, lengths,
                  engine=EngineModel(replicas=2, slots_per_replica=4, step_ms=1.0,
                                     step_ms_per_request=0.0, prefill_tokens_per_s=1e6,
                                     chunked_prefill_size=1024, max_total_tokens=pool),
                  trainer=TrainerSchedule(train_s=1.0, train_batches=0), capacity_slots=8,
                  adaptive=AdaptiveSlots(floor, interval_s=0.05) if floor is not None else None)
    limits: list[list[int]] = []
    sim.on_progress = lambda s: limits.append(list(s.limits))
    report = sim.run()
    sim.seen_limits = limits  # type: ignore[attr-defined]
    return sim, report


def test_adaptive_limits_change_nothing_while_the_pool_has_room(r):
    _, fixed = adaptive_run(r, "roomy-fixed", pool=100_000, floor=None)
    _, adaptive = adaptive_run(r, "roomy-adaptive", pool=100_000, floor=1)
    assert adaptive.limit_changes == 0 and adaptive.mean_slots_limit == 8
    assert (adaptive.all_work_s, adaptive.ready_times) == (fixed.all_work_s, fixed.ready_times)


@pytest.mark.parametrize("placement", ["any", "group"])
def test_a_full_pool_lowers_the_limits_and_capacity_with_them(r, placement):
    _, fixed = adaptive_run(r, f"full-fixed-{placement}", pool=4000, floor=None,
                            placement=placement)
    sim, adaptive = adaptive_run(r, f"full-adaptive-{placement}", pool=4000, floor=1,
                                 placement=placement)
    assert fixed.retractions > 0  # the pool is too small for four long members
    assert adaptive.limit_changes > 0 and adaptive.mean_slots_limit < 8
    seen = sim.seen_limits  # type: ignore[attr-defined]
    low = next(i for i, limits in enumerate(seen) if min(limits) == 1)
    assert any(limits == [4, 4] for limits in seen[low:])  # and back up
    assert adaptive.groups_accepted == 8 and adaptive.output_tokens == fixed.output_tokens
    if placement == "group":  # the ledger's replicas follow the limits
        assert sim.ledger.replica_slots() == {"sim-0": seen[-1][0], "sim-1": seen[-1][1]}


def test_a_tool_after_the_last_turn_holds_the_slot_before_the_episode_ends(r):
    """As on a worker, whose workflow runs every turn's tool (a test suite after the
    final answer, say)."""
    clock = ManualClock()
    ledger = Ledger(r, "last-tool", RolloutConfig(group_size=1, batch_size=1,
                                                  max_concurrent_samples=1), clock=clock)
    sim = SimFarm(ledger, clock, member_turns={"g": [[(10, 3.0, 0)]]},
                  engine=EngineModel(replicas=1, slots_per_replica=1, step_ms=1.0,
                                     step_ms_per_request=0.0, prefill_tokens_per_s=1e9),
                  trainer=TrainerSchedule(train_s=1.0, train_batches=0))
    report = sim.run()
    assert report.all_work_s == pytest.approx(3.0 + 10 * 0.001, abs=1e-6)
    assert report.mean_in_flight == pytest.approx(1.0)


def test_a_turn_aborted_by_two_pauses_goes_on_as_the_workers_pieces_do(r):
    """Each piece is ``<turn rid>-rN`` from the context and output so far; the output
    ids go on where the last piece stopped, so the next turn finds the whole turn in
    the cache (all but the tool's output)."""
    clock = ManualClock()
    ledger = Ledger(r, "twice", RolloutConfig(group_size=1, batch_size=1,
                                              max_concurrent_samples=3), clock=clock)
    sim = SimFarm(ledger, clock,
                  member_turns={"agent": [[(2000, 0.0, 5), (10, 0.0, 0)]],
                                "a": [[(10, 0.0, 0)]], "b": [[(20, 0.0, 0)]]},
                  prompt_tokens={"agent": 100},
                  engine=EngineModel(replicas=1, slots_per_replica=3, step_ms=1.0,
                                     step_ms_per_request=0.0, prefill_tokens_per_s=1e9),
                  trainer=TrainerSchedule(train_s=1.0, train_batches=2, pause_mode="abort"),
                  capacity_slots=3)
    report = sim.run()
    assert report.output_tokens == 2040 and report.groups_accepted == 3
    [replica] = sim.replicas
    agent = [e for e in replica.log if e["prompt_tokens"] >= 100]
    aid = agent[0]["rid"]
    assert [e["rid"] for e in agent] == [aid, f"{aid}-r1", f"{aid}-r2", f"{aid}-t001"]
    last = agent[-1]
    assert last["prompt_tokens"] == 100 + 2000 + 5
    assert last["cached_tokens"] == 100 + 2000
