"""``queue-rollout doctor``: recompute the ledger's counters from its records.

Invariant I3: reserved slots, running and doubtful attempts, and the group counters
must equal what the group and attempt records imply (each group's slots follow from its
mode, state and done count; each member has exactly one current attempt); the lease and doubt sets
must hold exactly the running and doubtful attempts; no counter may be negative.
The staleness budget's baseline must say that between none and all of the groups
consumed so far were consumed when the version was last set (``set_version`` makes it
``consumed - version * B``).
``repair`` rewrites the counters from the records, and a baseline out of that range as
if the version were set now (run it with admission paused).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.records import ENDED, SUPERSEDED, decode_attempt, decode_group

#: Group states whose attempts and results were deleted.
PURGED = frozenset({"consumed", "rejected"})

@dataclass
class Report:
    expected: dict[str, int]
    stored: dict[str, int]
    problems: list[str] = field(default_factory=list)
    #: the budget baseline repair writes, when the stored one is out of range
    baseline: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def _scan(client: redis.Redis, key: str) -> Iterator[tuple[bytes, bytes]]:
    yield from client.hscan_iter(key, count=1000)


def examine(client: redis.Redis, keys: Keys, batch_size: int) -> Report:
    """Compare stored counters with those recomputed from the records; *batch_size* is
    the farm's B (the budget baseline counts groups)."""
    groups = {gid.decode(): decode_group(raw) for gid, raw in _scan(client, keys.groups)}
    states = Counter(g.state for g in groups.values())
    live: dict[str, set[str]] = {"running": set(), "doubtful": set()}
    ended = Counter[str]()  # group id -> members whose current attempt ended
    current = Counter[tuple[str, int]]()  # (group id, member) -> attempts not superseded
    for aid, raw in _scan(client, keys.attempts):
        a = decode_attempt(raw)
        if a.state in live:
            live[a.state].add(aid.decode())
        if a.state not in SUPERSEDED:
            current[(a.g, a.m)] += 1
        if a.state in ENDED:
            ended[a.g] += 1

    expected = {
        "reserved": sum(g.slots_held for g in groups.values()),
        "running": len(live["running"]),
        "doubtful": len(live["doubtful"]),
        "in_flight": states["in_flight"] + states["complete"],
        "accepted": states["accepted"] + states["delivered"] + states["consumed"],
        "rejected": states["rejected"],
        "consumed": states["consumed"],
        "admitted": len(groups),
        "partial": sum(1 for g in groups.values()
                       if g.state == "in_flight" and g.done > 0 and g.G > 1),
    }
    stored = {f.decode(): int(v) for f, v in client.hgetall(keys.counters).items()}
    report = Report(expected, stored)
    problems = report.problems
    for name, value in expected.items():
        if stored.get(name, 0) != value:
            problems.append(f"{name}: stored {stored.get(name, 0)}, records say {value}")
    problems += [f"{name}: negative ({value})" for name, value in sorted(stored.items())
                 if value < 0]
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
    ready = client.llen(keys.ready)
    if ready != states["accepted"]:
        problems.append(f"ready queue holds {ready}, {states['accepted']} groups are accepted")
    version, baseline = (int(v or 0) for v in client.hmget(keys.state, "version",
                                                          "budget_baseline"))
    consumed_at_set = baseline + version * batch_size
    if not 0 <= consumed_at_set <= expected["consumed"]:
        report.baseline = expected["consumed"] - version * batch_size
        problems.append(
            f"budget_baseline: stored {baseline}, which counts {consumed_at_set} groups "
            f"consumed at version {version}, not between 0 and the {expected['consumed']} "
            f"consumed (B = {batch_size})")
    return report


def repair(client: redis.Redis, keys: Keys, batch_size: int) -> Report:
    """Rewrite the derived counters, the lease/doubt sets and an out-of-range budget
    baseline from the records."""
    report = examine(client, keys, batch_size)
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.counters, mapping=report.expected)
    if report.baseline is not None:
        pipe.hset(keys.state, "budget_baseline", report.baseline)
    pipe.delete(keys.leases, keys.doubt)
    for aid, raw in _scan(client, keys.attempts):
        a = decode_attempt(raw)
        if a.state == "running" and a.lease is not None:
            pipe.zadd(keys.leases, {aid: a.lease})
        elif a.state == "doubtful" and a.doubt_at is not None:
            pipe.zadd(keys.doubt, {aid: a.doubt_at})
    pipe.execute()
    return report
