"""A farm of several cells, the ledger's part: the control Redis holds the farm-wide
staleness budget (reserve, settle, the batches) and each cell its slots and attempts
(admit of a reserved group, the episodes, its own judgement). Here the control Redis
and the cells are databases of one real redis-server: each script runs on one of
them, as it would on its own server."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from queue_rollout.config import RolloutConfig
from queue_rollout.errors import LedgerError
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.ledger import cells
from queue_rollout.ledger.core import Admission, Ledger
from queue_rollout.ledger.doctor import examine_control
from testkit import trivial_prompts

#: G 2, B 2, no staleness: two groups in flight farm-wide at version 0.
ROLLOUT = {"group_size": 2, "batch_size": 2, "max_staleness": 0, "max_concurrent_samples": 8}

MakeLedger = Callable[..., Ledger]


@pytest.fixture
def on_db(redis_url: str, clock: ManualClock):
    """``on_db(n, **rollout)`` -> a Ledger of farm "c" on database *n*."""
    clients: list[redis.Redis] = []

    def make(db: int, **fields: object) -> Ledger:
        client = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + f"/{db}")
        clients.append(client)
        return Ledger(client, "c", RolloutConfig(**{**ROLLOUT, **fields}),  # type: ignore[arg-type]
                      clock=clock)

    yield make
    for client in clients:
        client.close()


def complete(cell: Ledger, admission: Admission) -> None:
    for member, aid in enumerate(admission.attempt_ids):
        assert cell.start(aid, "w", "r0", "boot0", 30).status == "started"
        assert cell.finish(aid, member, b"result", output_tokens=3).status == "recorded"


def test_the_staleness_budget_holds_over_the_whole_farm(on_db: MakeLedger) -> None:
    control, a, b = on_db(1), on_db(2), on_db(3)
    a.submit(trivial_prompts(3, "a"))
    b.submit(trivial_prompts(3, "b"))
    first, second = cells.admit_next(control, a, "a"), cells.admit_next(control, b, "b")
    assert (first.status, second.status) == ("admitted", "admitted")
    # each cell has one group in flight, room and (alone) budget for another; the
    # farm's budget of 2 is spent
    assert cells.admit_next(control, a, "a").reason == "staleness"
    assert cells.admit_next(control, b, "b").reason == "staleness"
    assert control.counters()["in_flight"] == 2
    assert a.counters()["in_flight"] == b.counters()["in_flight"] == 1

    for cell, admission in ((a, first), (b, second)):
        complete(cell, admission)
        assert cells.judge(control, cell, admission.group_id, accept=True).status == "accepted"
    assert cells.admit_next(control, b, "b").reason == "staleness"  # accepted, not yet consumed
    delivery = control.pop_batch("trainer")
    assert delivery is not None
    assert sorted(delivery.batch.groups) == ["a0", "b0"]
    assert cells.ack(control, {"a": a, "b": b}, "trainer", delivery.batch.id,
                         delivery.batch.groups).count == 2
    for cell, gid in ((a, "a0"), (b, "b0")):  # each cell consumed what it ran
        assert cell.group(gid).state == "consumed"
        assert cell.client.hlen(cell.keys.results) == 0
        assert cell.ready_groups() == []
    assert cells.sweep_consumed(control, {"a": a, "b": b}) == 0
    control.set_version(1)
    assert cells.admit_next(control, b, "b").status == "admitted"
    assert cells.admit_next(control, b, "b").status == "admitted"
    assert cells.admit_next(control, a, "a").reason == "staleness"
    counters = control.counters()
    assert (counters["in_flight"], counters["accepted"], counters["consumed"]) == (2, 2, 2)


def test_a_crash_between_reserve_and_admit_holds_budget_and_admits_once(
        on_db: MakeLedger) -> None:
    control, cell = on_db(1), on_db(2, max_staleness=1)
    cell.submit(trivial_prompts(2))
    held = control.reserve("p0", "a")
    assert (held.status, held.version, held.cell) == ("reserved", 0, "a")
    # the collector died here; the one after it reserves the same group again
    again = control.reserve("p0", "other")
    assert (again.status, again.version, again.cell) == ("already", 0, "a")
    assert control.counters()["in_flight"] == 1  # held once, not started yet
    for ledger in (control, cell):  # the farm moved on meanwhile: the group keeps its version
        ledger.set_version(3)
    admitted = cells.admit_next(control, cell, "a")  # the step again finishes it
    assert admitted.status == "admitted" and admitted.group_id == "p0"
    assert cell.group("p0").version == 0
    # the admission sent again (its answer lost): the same attempts, nothing more held
    resent = cell.admit(reserved=("p0", 0))
    assert (resent.status, resent.attempt_ids) == ("already", admitted.attempt_ids)
    assert cell.counters()["reserved"] == 2
    assert cell.client.lrange(cell.keys.pending, 0, -1) == [b"p1"]


def test_a_cell_decides_its_slots_and_takes_only_its_next_pending_group(
        on_db: MakeLedger) -> None:
    control, cell = on_db(1, max_staleness=4), on_db(2, max_concurrent_samples=2)
    cell.submit(trivial_prompts(2))
    first = cells.admit_next(control, cell, "a")
    assert first.status == "admitted"
    blocked = cells.admit_next(control, cell, "a")  # budget held on control, no slots here
    assert blocked.reason == "capacity"
    assert control.reserve("p1", "a").status == "already"  # its reservation waits
    with pytest.raises(LedgerError, match="not the next pending"):
        cell.admit(reserved=("p9", 0))
    k = cell.keys
    with pytest.raises(redis.ResponseError, match="without its version"):
        cell._scripts.call(
            "admit", [k.counters, k.state, k.pending, k.groups, k.attempts, k.outbox,
                      k.replica_free, k.replica_load, k.placed, k.refusals, k.history,
                      k.history_index],
            [1, 2, 2, 2, 4, "sample", "any", 10, 60, "x1", "x2", "p1"])
    complete(cell, first)
    assert cells.admit_next(control, cell, "a").group_id == "p1"
    assert control.counters()["in_flight"] == 2


def test_a_settled_group_keeps_its_first_verdict(on_db: MakeLedger) -> None:
    control = on_db(1, max_staleness=4)
    for gid in ("g0", "g1"):
        assert control.reserve(gid, "a").status == "reserved"
    assert control.settle("g0", accept=True).status == "accepted"
    assert control.settle("g1", accept=False, reason="zero_variance").reason == "zero_variance"
    before = control.counters()
    # a collector judging again after a crash is answered the first verdicts
    assert control.settle("g0", accept=False, reason="plugin").status == "accepted"
    again = control.settle("g1", accept=True)
    assert (again.status, again.reason) == ("rejected", "zero_variance")
    assert control.counters() == before
    assert (before["in_flight"], before["accepted"]) == (0, 1)
    assert control.client.lrange(control.keys.ready, 0, -1) == [b"g0"]
    assert control.settle("nobody", accept=True).ignored
    with pytest.raises(redis.ResponseError, match="verdict"):
        control._scripts.call("settle", [control.keys.counters, control.keys.groups,
                                         control.keys.ready], [1, "g0", "maybe", ""])


def test_a_paused_farm_reserves_nothing(on_db: MakeLedger) -> None:
    control = on_db(1)
    control.set_paused(True)
    assert control.reserve("g0", "a").reason == "paused"
    assert control.counters().get("in_flight", 0) == 0


def test_a_crash_between_settle_and_the_cells_judgement_judges_as_settled(
        on_db: MakeLedger) -> None:
    control, cell = on_db(1, max_staleness=4), on_db(2)
    cell.submit(trivial_prompts(2))
    kept, dropped = (cells.admit_next(control, cell, "a") for _ in range(2))
    for admission in (kept, dropped):
        complete(cell, admission)
    # settled on control, then the collector died before the cell's judgement; the one
    # after it reaches another verdict (a plugin that answers otherwise this time)
    assert control.settle(kept.group_id, accept=True).status == "accepted"
    assert control.settle(dropped.group_id, accept=False, reason="plugin").status == "rejected"
    again = cells.judge(control, cell, kept.group_id, accept=False, reason="plugin",
                        detail="a second opinion")
    assert again.status == "accepted"
    assert cells.judge(control, cell, dropped.group_id, accept=True).reason == "plugin"
    assert cell.ready_groups() == control.ready_groups() == [kept.group_id]
    assert cell.group(dropped.group_id).state == "rejected"
    assert cell.client.hlen(cell.keys.attempts) == 2  # the rejected group's detail gone
    assert control.counters()["in_flight"] == cell.counters()["in_flight"] == 0
    # judged in both: a third time is ignored by both halves, nothing changes
    assert cells.judge(control, cell, kept.group_id, accept=True).ignored


def test_a_crash_after_the_farms_ack_is_finished_by_the_sweep(on_db: MakeLedger) -> None:
    control, a, b = on_db(1, max_staleness=4), on_db(2), on_db(3)
    farm = {"a": a, "b": b}
    for name, cell in farm.items():
        cell.submit(trivial_prompts(1, name))
        admission = cells.admit_next(control, cell, name)
        complete(cell, admission)
        cells.judge(control, cell, admission.group_id, accept=True)
    delivery = control.pop_batch("trainer")
    assert delivery is not None
    assert control.ack("trainer", delivery.batch.id).count == 2  # then the crash
    assert [c.group(f"{n}0").state for n, c in farm.items()] == ["accepted", "accepted"]
    assert cells.sweep_consumed(control, farm) == 2
    assert [c.group(f"{n}0").state for n, c in farm.items()] == ["consumed", "consumed"]
    assert cells.sweep_consumed(control, farm) == 0
    assert [c.counters()["consumed"] for c in farm.values()] == [1, 1]


def test_a_group_reserved_for_another_cell_is_not_admitted_here(on_db: MakeLedger) -> None:
    control, cell = on_db(1), on_db(2)
    cell.submit(trivial_prompts(1))
    assert control.reserve("p0", "elsewhere").status == "reserved"
    with pytest.raises(LedgerError, match="reserved for cell elsewhere"):
        cells.admit_next(control, cell, "a")
    assert cell.counters().get("admitted", 0) == 0
    assert cells.admit_next(control, on_db(3), "b").status == "empty"


def test_a_groups_cell_follows_its_id_in_proportion_to_the_weights() -> None:
    ids = [f"g{i}" for i in range(4000)]
    equal = {"a": 1.0, "b": 1.0, "c": 1.0}
    counts = dict.fromkeys(equal, 0)
    for gid in ids:
        counts[cells.cell_for(gid, equal)] += 1
    assert all(1200 < n < 1470 for n in counts.values()), counts  # 1,333 each +- 5 sd
    assert [cells.cell_for(g, equal) for g in ids[:50]] == [
        cells.cell_for(g, dict(reversed(equal.items()))) for g in ids[:50]]  # order-free
    heavy = {"a": 3.0, "b": 1.0}
    share = sum(cells.cell_for(g, heavy) == "a" for g in ids) / len(ids)
    assert 0.72 < share < 0.78, share
    # a cell added takes ids from the others; none move between the cells that stay
    grown = {**equal, "d": 1.0}
    moved = [g for g in ids if cells.cell_for(g, grown) not in ("d", cells.cell_for(g, equal))]
    assert moved == []
    with pytest.raises(ValueError, match="positive"):
        cells.cell_for("g", {"a": 0.0})


def test_a_submission_goes_to_each_prompts_cell_all_or_none(on_db: MakeLedger) -> None:
    farm = {"a": on_db(2), "b": on_db(3)}
    weights = {"a": 1.0, "b": 1.0}
    prompts = trivial_prompts(20)
    assert cells.submit(farm, weights, prompts).count == 20
    for name, cell in farm.items():
        pending = [g.decode() for g in cell.client.lrange(cell.keys.pending, 0, -1)]
        assert pending == [p for p, _ in prompts if cells.cell_for(p, weights) == name]
        assert pending  # both cells got some
    again = cells.submit(farm, weights, [*trivial_prompts(3, "new"), prompts[7]])
    assert (again.status, again.duplicates) == ("duplicate", ("p7",))
    assert sum(c.client.llen(c.keys.pending) for c in farm.values()) == 20  # none added


def test_doctor_checks_the_control_redis_against_its_cells(on_db: MakeLedger) -> None:
    control, a, b = on_db(1, max_staleness=4), on_db(2), on_db(3)
    farm = {"a": a, "b": b}
    clients = {name: cell.client for name, cell in farm.items()}

    def problems() -> list[str]:
        return examine_control(control.client, control.keys, 2, clients).problems

    a.submit(trivial_prompts(2, "a"))
    b.submit(trivial_prompts(1, "b"))
    done = cells.admit_next(control, a, "a")
    complete(a, done)
    cells.judge(control, a, done.group_id, accept=True)
    cells.admit_next(control, b, "b")
    assert problems() == []
    control.reserve("a1", "a")  # reserved, its admission cut short: the cell's next one
    assert problems() == []
    a.submit(trivial_prompts(1, "z"))
    a.client.lmove(a.keys.pending, a.keys.pending, "RIGHT", "LEFT")  # z0 first: a1 not next
    assert problems() == ["group a1: in_flight for cell a, which has no record of it"]
    control.client.hdel(control.keys.groups, "b0")
    control.client.hincrby(control.keys.counters, "in_flight", -1)
    assert problems()[-1] == ("cell b: group b0 runs there, but the control Redis has it "
                              "nowhere")
    control.client.hincrby(control.keys.counters, "accepted", 5)
    assert "accepted: stored 6, records say 1" in problems()
