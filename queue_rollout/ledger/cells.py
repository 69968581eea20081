"""The steps that span two Redis servers on a farm of several cells.

A cell is a farm ledger as on a farm of one (its slots, attempts, leases, results and
job queues, its own judgement of the groups it ran); the control Redis holds what is
farm-wide (the policy version and pause flag, the staleness budget, the farm's ready
groups and batches). A step that needs both takes the farm-wide decision first, in
one idempotent script keyed by the group, then the cell's, so that a crash between
the two can leave budget held for a group not started yet (less admitted for a while),
never more admitted than the budget allows; the same step run again finishes it.

Each step here is one function of the control ledger and the cell ledger(s): the
collector and the trainer's client call them, tests drive them with a crash between
the halves.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

from queue_rollout.config import Config
from queue_rollout.errors import LedgerError
from queue_rollout.ledger.connection import connect_config
from queue_rollout.ledger.core import Admission, Answer, Ledger


def connect_farm(config: Config) -> tuple[Ledger, dict[str, Ledger]]:
    """The farm's ledger (on a farm of cells, the control Redis's) and each cell's by
    name (none on a farm of one Redis), each checked against the shape its server
    recorded."""
    cells = {}
    for cell in config.cells:
        seen = config.for_cell(cell.name)
        cells[cell.name] = Ledger.from_config(connect_config(seen), seen)
    return Ledger.from_config(connect_config(config), config), cells


def set_version(control: Ledger, cells: Mapping[str, Ledger], version: int) -> int:
    """The policy version, in every cell first (nothing admitted under the new budget
    starts under the old version), then on *control*; returns the previous one."""
    for cell in cells.values():
        cell.set_version(version)
    return control.set_version(version)


def admit_next(control: Ledger, cell: Ledger, name: str,
               live_worker_slots: int | None = None) -> Admission:
    """Admit cell *name*'s next pending group: the farm-wide budget reserved on
    *control* (a group reserved before, whose admission a crash cut short, answers
    that reservation again), then the group admitted in *cell* under the reserved
    version, its slots the cell's to decide (without room there it waits, its budget
    held, and the next call takes it again). The reservation is asked for on every
    call, not remembered between them: a control Redis restarted without its last
    writes (``appendfsync everysec``) may have lost it, and a group its cell admitted
    with no reservation there would never be settled."""
    group_id = cell.next_pending()
    if group_id is None:
        return Admission("empty")
    reservation = control.reserve(group_id, name)
    if reservation.status == "blocked":
        return Admission("blocked", reservation.reason)
    if reservation.cell != name:
        raise LedgerError(f"group {group_id} is pending in cell {name} but reserved for "
                          f"cell {reservation.cell}")
    return cell.admit(live_worker_slots, reserved=(group_id, reservation.version))


def judge(control: Ledger, cell: Ledger, group_id: str, *, accept: bool, reason: str = "",
          entry_id: str = "", detail: str = "") -> Answer:
    """The verdict on a group *cell* completed: settled on *control* first (accepted,
    it joins the farm's ready groups), then judged in the cell under the verdict
    settled (the first one, should the group have been settled before a crash)."""
    settled = control.settle(group_id, accept=accept, reason=reason)
    if settled.ignored:
        return settled
    accepted = settled.status == "accepted"
    return cell.judge(group_id, accept=accepted, reason=settled.reason, entry_id=entry_id,
                      detail=detail if settled.reason == reason else "")


def ack(control: Ledger, cells: Mapping[str, Ledger], consumer: str, batch_id: str,
        group_ids: Sequence[str]) -> Answer:
    """The trainer trained on batch *batch_id* (its groups *group_ids*): acknowledged on
    *control* (its answer), then each group's detail deleted in the cell that ran it.
    Should a crash cut this short after the acknowledgement, :func:`sweep_consumed`
    finishes it."""
    answer = control.ack(consumer, batch_id)
    if answer.status == "acked":
        _consume(control, cells, list(group_ids), batch_id, consumer)
    return answer


def sweep_consumed(control: Ledger, cells: Mapping[str, Ledger]) -> int:
    """The groups still accepted in their cell that *control* has consumed (an
    acknowledgement cut short after its first half), consumed in their cell. Returns
    how many."""
    return sum(_consume(control, {name: cell}, cell.ready_groups(), "", "")
               for name, cell in cells.items())


def _consume(control: Ledger, cells: Mapping[str, Ledger], group_ids: list[str],
             batch_id: str, consumer: str) -> int:
    """Of *group_ids*, those *control* has consumed, consumed in their cell (once: a
    group consumed there already is passed over); how many this call consumed."""
    by_cell: dict[str, list[str]] = {}
    for group_id, record in zip(group_ids, control.groups(group_ids), strict=True):
        if record is not None and record.state == "consumed" and record.cell is not None:
            by_cell.setdefault(record.cell, []).append(group_id)
    return sum(cells[name].consume(batch_id, consumer, ids).count
               for name, ids in by_cell.items() if name in cells)


def cell_for(group_id: str, weights: Mapping[str, float]) -> str:
    """The cell a new group goes to: rendezvous hashing of its id over the cells, each
    drawn in proportion to its weight (its slots). The same id always lands in the same
    cell (whose own submission then refuses it a second time, so ids stay unique over
    the farm), whichever process submits it; a change of weights moves only the ids
    the changed cells win or lose."""
    if not weights or any(w <= 0 for w in weights.values()):
        raise ValueError(f"cells need positive weights, got {dict(weights)}")

    def score(name: str) -> float:
        digest = hashlib.blake2b(f"{name}\0{group_id}".encode(), digest_size=8).digest()
        u = (int.from_bytes(digest, "big") + 0.5) / 2.0**64  # in (0, 1)
        return -weights[name] / math.log(u)

    return max(sorted(weights), key=score)


def submit(cells: Mapping[str, Ledger], weights: Mapping[str, float],
           prompts: Sequence[tuple[str, bytes]]) -> Answer:
    """Prompts (id, prompt JSON), each to its cell (:func:`cell_for`), all or none:
    ``submitted`` with their ``count``, or ``duplicate`` with the ids the farm knows
    already (nothing added). Every cell is asked first; should a concurrent submission
    of the same id win the race in between, the prompts already in other cells stay
    and LedgerError says which."""
    by_cell: dict[str, list[tuple[str, bytes]]] = {}
    for pid, payload in prompts:
        by_cell.setdefault(cell_for(pid, weights), []).append((pid, payload))
    known = [pid for name, batch in by_cell.items()
             for pid in cells[name].known([p for p, _ in batch])]
    if known:
        return Answer("duplicate", duplicates=tuple(known))
    done: list[str] = []
    for name, batch in by_cell.items():
        answer = cells[name].submit(batch)
        if answer.status == "duplicate":
            raise LedgerError(f"submitted meanwhile by another client: "
                              f"{', '.join(answer.duplicates)} (cell {name}); already "
                              f"submitted: {', '.join(done) or 'none'}")
        done += [pid for pid, _ in batch]
    return Answer("submitted", count=len(done))
