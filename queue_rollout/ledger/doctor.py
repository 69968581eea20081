"""``queue-rollout doctor``: recompute the ledger's counters from its records.

Invariant I3: reserved slots, running and doubtful attempts, and the group counters
must equal what the group and attempt records imply (each group's slots follow from its
mode, state and done count; each member has exactly one current attempt); the lease and doubt sets
must hold exactly the running and doubtful attempts; no counter may be negative.
The staleness budget's baseline must say that between none and all of the groups
consumed so far were consumed when the version was last set (``set_version`` makes it
``consumed - version * B``).
Records must agree with each other as well: a stored result belongs to a member whose
current attempt has ended; every delivered group is in exactly one consumer's held
batch, and a held batch holds only delivered groups.
With placement, each replica's load (attempts placed on its queue, plus those it runs
or ran while in doubt), its free slots (its slots less that load) and the set of
placed attempts must match the attempt records too.
``repair`` rewrites the counters (and the placement sets) from the records, and a
baseline out of that range as if the version were set now; it deletes a result no
ended attempt stands for (the member's attempt runs, or ran, again and records its
own), puts a delivered group that no batch holds back at the head of the ready queue,
and takes out of a held batch the
groups that are not delivered (run it with admission paused).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.records import (
    ENDED,
    SUPERSEDED,
    GroupRecord,
    decode_attempt,
    decode_batch,
    decode_group,
)

#: Group states whose attempts and results were deleted.
PURGED = frozenset({"consumed", "rejected"})

@dataclass
class Report:
    expected: dict[str, int]
    stored: dict[str, int]
    problems: list[str] = field(default_factory=list)
    #: the budget baseline repair writes, when the stored one is out of range
    baseline: int | None = None
    #: results (episode fields) that no ended attempt stands for
    orphan_results: list[str] = field(default_factory=list)
    #: delivered groups that no held batch holds
    unheld_groups: list[str] = field(default_factory=list)
    #: consumer -> (its held batch's record, the groups of it that are delivered)
    trimmed_batches: dict[str, tuple[bytes, list[str]]] = field(default_factory=dict)
    #: placement: worker -> load the records imply (placed queued, run or in doubt)
    replica_load: dict[str, int] = field(default_factory=dict)
    #: placement: queued attempts placed on a replica -> when they were created
    placed: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _scan(client: redis.Redis, key: str) -> Iterator[tuple[bytes, bytes]]:
    yield from client.hscan_iter(key, count=1000)


def examine(client: redis.Redis, keys: Keys, batch_size: int) -> Report:
    """Compare stored counters with those recomputed from the records; *batch_size* is
    the farm's B (the budget baseline counts groups)."""
    groups = {gid.decode(): decode_group(raw) for gid, raw in _scan(client, keys.groups)}
    states: Counter[str] = Counter(g.state for g in groups.values())
    live: dict[str, set[str]] = {"running": set(), "doubtful": set()}
    ended = Counter[str]()  # group id -> members whose current attempt ended
    current = Counter[tuple[str, int]]()  # (group id, member) -> attempts not superseded
    ended_members: set[str] = set()  # episode fields whose current attempt ended
    tool_wait = 0  # running attempts waiting on a tool
    load = Counter[str]()  # placement: worker -> placed queued + live attempts
    placed: dict[str, float] = {}
    for aid, raw in _scan(client, keys.attempts):
        a = decode_attempt(raw)
        if a.load_counted and a.state == "queued" and a.placed_on:
            load[a.placed_on] += 1
            placed[aid.decode()] = a.created_at
        elif a.load_counted and a.state in live and a.worker:
            load[a.worker] += 1
        if a.state in live:
            live[a.state].add(aid.decode())
        if a.state == "running" and a.tool:
            tool_wait += 1
        if a.state not in SUPERSEDED:
            current[(a.group_id, a.member)] += 1
        if a.state in ENDED:
            ended[a.group_id] += 1
            ended_members.add(f"{a.group_id}/{a.member}")

    expected = {
        "reserved": sum(g.slots_held for g in groups.values()),
        "running": len(live["running"]),
        "doubtful": len(live["doubtful"]),
        "tool_wait": tool_wait,
        "in_flight": states["in_flight"] + states["complete"],
        "accepted": states["accepted"] + states["delivered"] + states["consumed"],
        "rejected": states["rejected"],
        "consumed": states["consumed"],
        "admitted": len(groups),
        "partial": sum(1 for g in groups.values()
                       if g.state == "in_flight" and g.done > 0 and g.G > 1),
    }
    report = _counters_report(client, keys, expected)
    problems = report.problems
    for state, zkey in (("running", keys.leases), ("doubtful", keys.doubt)):
        members = {m.decode() for m in client.zrange(zkey, 0, -1)}
        if members != live[state]:
            problems.append(
                f"{zkey}: holds {len(members)} attempts, {len(live[state])} are {state}")
    for gid, g in sorted(groups.items()):
        if g.state in PURGED:
            continue
        if ended[gid] != g.done:
            problems.append(f"group {gid}: done {g.done}, {ended[gid]} members ended")
        for m in range(g.G):
            if current[(gid, m)] != 1:
                problems.append(f"group {gid} member {m}: {current[(gid, m)]} current attempts")
    report.replica_load, report.placed = dict(load), placed
    _check_placement(client, keys, report)
    _check_results(client, keys, ended_members, report)
    _check_batches(client, keys, groups, report)
    _check_ready_and_budget(client, keys, batch_size, states, report)
    return report


def _counters_report(client: redis.Redis, keys: Keys, expected: dict[str, int]) -> Report:
    """The stored counters against *expected* (recomputed from the records), and any
    negative one, as the report's first problems."""
    stored = {f.decode(): int(v) for f, v in client.hgetall(keys.counters).items()}
    report = Report(expected, stored)
    report.problems += [f"{name}: stored {stored.get(name, 0)}, records say {value}"
                        for name, value in expected.items() if stored.get(name, 0) != value]
    report.problems += [f"{name}: negative ({value})" for name, value in sorted(stored.items())
                        if value < 0]
    return report


def _check_ready_and_budget(client: redis.Redis, keys: Keys, batch_size: int,
                            states: Counter[str], report: Report) -> None:
    """The ready queue against the accepted groups, and the budget's baseline against
    the groups consumed."""
    ready = client.llen(keys.ready)
    if ready != states["accepted"]:
        report.problems.append(
            f"ready queue holds {ready}, {states['accepted']} groups are accepted")
    version, baseline = (int(v or 0) for v in client.hmget(keys.state, "version",
                                                          "budget_baseline"))
    consumed_at_set = baseline + version * batch_size
    if not 0 <= consumed_at_set <= states["consumed"]:
        report.baseline = states["consumed"] - version * batch_size
        report.problems.append(
            f"budget_baseline: stored {baseline}, which counts {consumed_at_set} groups "
            f"consumed at version {version}, not between 0 and the {states['consumed']} "
            f"consumed (B = {batch_size})")


def examine_control(client: redis.Redis, keys: Keys, batch_size: int,
                    cells: dict[str, redis.Redis]) -> Report:
    """The control Redis of a farm of cells: its group counters (in flight, accepted,
    consumed) against its group records, its batches, ready queue and budget baseline
    as on a farm of one, and each group's record against its cell's. A group in flight
    here whose cell has not admitted it yet must be that cell's next pending one (a
    reservation whose admission a crash cut short: the cell's collector takes it next);
    a group a cell runs must be on record here, for that cell."""
    groups = {gid.decode(): decode_group(raw) for gid, raw in _scan(client, keys.groups)}
    states: Counter[str] = Counter(g.state for g in groups.values())
    expected = {"in_flight": states["in_flight"],
                "accepted": states["accepted"] + states["delivered"] + states["consumed"],
                "consumed": states["consumed"]}
    report = _counters_report(client, keys, expected)
    _check_batches(client, keys, groups, report)
    _check_ready_and_budget(client, keys, batch_size, states, report)
    for name, cell in sorted(cells.items()):
        theirs = {gid.decode() for gid, _ in _scan(cell, keys.groups)}
        head = cell.lindex(keys.pending, 0)
        for gid, g in sorted(groups.items()):
            if g.cell == name and gid not in theirs and (
                    g.state != "in_flight" or head is None or head.decode() != gid):
                report.problems.append(f"group {gid}: {g.state} for cell {name}, which has "
                                       "no record of it")
        for gid in sorted(theirs):
            if gid not in groups or groups[gid].cell != name:
                report.problems.append(f"cell {name}: group {gid} runs there, but the "
                                       "control Redis has it "
                                       + (f"in cell {groups[gid].cell}" if gid in groups
                                          else "nowhere"))
    return report


def _check_placement(client: redis.Redis, keys: Keys, report: Report) -> None:
    """Each replica's load and free slots, and the placed set, against the records."""
    stored = {w.decode(): int(n) for w, n in client.hgetall(keys.replica_load).items()}
    for worker in sorted(set(stored) | set(report.replica_load)):
        if stored.get(worker, 0) != report.replica_load.get(worker, 0):
            report.problems.append(f"replica {worker}: load {stored.get(worker, 0)}, records "
                                   f"say {report.replica_load.get(worker, 0)}")
    free = {w.decode(): int(n) for w, n in client.zrange(keys.replica_free, 0, -1,
                                                         withscores=True)}
    for worker, expected in _free_slots(client, keys, report.replica_load).items():
        if free.pop(worker, None) != expected:
            report.problems.append(f"replica {worker}: free slots not {expected} (its slots "
                                   "less its load)")
    report.problems += [f"replica {w}: has free slots but is not placeable" for w in free]
    members = {m.decode() for m in client.zrange(keys.placed, 0, -1)}
    if members != set(report.placed):
        report.problems.append(f"{keys.placed}: holds {len(members)} attempts, "
                               f"{len(report.placed)} are queued on a replica")


def _free_slots(client: redis.Redis, keys: Keys, load: dict[str, int]) -> dict[str, int]:
    """Worker -> slots - load, for each placeable worker."""
    return {w.decode(): int(n) - load.get(w.decode(), 0)
            for w, n in client.hgetall(keys.replica_slots).items()}


def _check_results(client: redis.Redis, keys: Keys, ended_members: set[str],
                   report: Report) -> None:
    for field_raw, _ in _scan(client, keys.results):
        episode = field_raw.decode()
        if episode not in ended_members:
            report.orphan_results.append(episode)
            report.problems.append(f"result {episode}: no ended attempt stands for it")


def _check_batches(client: redis.Redis, keys: Keys, groups: dict[str, GroupRecord],
                   report: Report) -> None:
    held: dict[str, str] = {}  # group id -> consumer holding it
    for consumer_raw, raw in _scan(client, keys.batches):
        consumer, batch = consumer_raw.decode(), decode_batch(raw)
        keep = []
        for gid in batch.groups:
            state = groups[gid].state if gid in groups else "unknown"
            if state != "delivered" or gid in held:
                report.problems.append(f"batch {batch.id} of {consumer}: group {gid} is "
                                       + (f"held by {held[gid]} too" if gid in held else state))
            else:
                held[gid] = consumer
                keep.append(gid)
        if len(keep) != len(batch.groups):
            report.trimmed_batches[consumer] = (raw, keep)
    for gid, g in sorted(groups.items()):
        if g.state == "delivered" and gid not in held:
            report.unheld_groups.append(gid)
            report.problems.append(f"group {gid}: delivered, but no batch holds it")


def repair(client: redis.Redis, keys: Keys, batch_size: int) -> Report:
    """Rewrite the derived counters, the lease/doubt sets, the replicas' load and free
    slots, the placed set and an out-of-range budget baseline from the records."""
    report = examine(client, keys, batch_size)
    pipe = client.pipeline(transaction=True)
    if report.orphan_results:
        pipe.hdel(keys.results, *report.orphan_results)
    for consumer, (raw, keep) in report.trimmed_batches.items():
        if keep:  # edited as JSON: the scripts' decoder sees only the fields it wrote
            pipe.hset(keys.batches, consumer, json.dumps({**json.loads(raw), "groups": keep}))
        else:
            pipe.hdel(keys.batches, consumer)
    for gid in reversed(report.unheld_groups):  # back at the head, in their order
        raw_group = client.hget(keys.groups, gid)
        if raw_group is not None:
            pipe.hset(keys.groups, gid, json.dumps({**json.loads(raw_group),
                                                    "state": "accepted"}))
            pipe.lpush(keys.ready, gid)
    pipe.hset(keys.counters, mapping=report.expected)
    if report.baseline is not None:
        pipe.hset(keys.state, "budget_baseline", report.baseline)
    pipe.delete(keys.leases, keys.doubt, keys.replica_load, keys.replica_free, keys.placed)
    if report.replica_load:
        pipe.hset(keys.replica_load, mapping=report.replica_load)
    free = _free_slots(client, keys, report.replica_load)
    if free:
        pipe.zadd(keys.replica_free, free)
    if report.placed:
        pipe.zadd(keys.placed, report.placed)
    for aid, raw in _scan(client, keys.attempts):
        a = decode_attempt(raw)
        if a.state == "running" and a.lease is not None:
            pipe.zadd(keys.leases, {aid: a.lease})
        elif a.state == "doubtful" and a.doubt_at is not None:
            pipe.zadd(keys.doubt, {aid: a.doubt_at})
    pipe.execute()
    return report
