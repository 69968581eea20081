"""The virtual-time farm under each pause mode: every group delivered with its exact
tokens; what each mode costs the replicas in prefill, from the engine model."""

from __future__ import annotations

import pytest

from queue_rollout.config import RolloutConfig
from queue_rollout.engines.sim_model import PauseMode
from queue_rollout.ledger.core import Ledger
from queue_rollout.virtual.clock import ManualClock
from queue_rollout.virtual.farm import SimFarm, SimReport, long_tail_lengths

GROUPS, G = 16, 4


def simulate(r, farm: str, pause_mode: PauseMode) -> tuple[SimFarm, SimReport]:
    clock = ManualClock()
    rollout = RolloutConfig(group_size=G, batch_size=2, max_concurrent_samples=8)
    ledger = Ledger(r, farm, rollout, clock=clock)
    sim = SimFarm(ledger, clock, long_tail_lengths(GROUPS, G, short=200, long=2000),
                  replicas=2, slots_per_replica=4, step_ms=1.0, step_ms_per_request=0.0,
                  train_s=1.0, train_batches=4, capacity_slots=8, pause_mode=pause_mode,
                  prompt_tokens={f"lt-{i:04d}": 300 for i in range(GROUPS)},
                  prefill_tokens_per_s=10_000.0)
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
