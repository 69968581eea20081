"""``queue-rollout doctor``: recompute the ledger's counters from its records.

Invariant I3: reserved slots, running and doubtful attempts, and the group counters
must equal what the group, episode and attempt records imply; the lease and doubt sets
must hold exactly the running and doubtful attempts; no counter may be negative.
``repair`` rewrites the counters from the records (run it with admission paused).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import redis

from .keys import Keys
from .records import decode_attempt, decode_episode, decode_group

#: Counters the records determine; the others (cumulative totals) are history.
DERIVED = ("reserved", "running", "doubtful", "in_flight", "accepted", "rejected",
           "consumed", "admitted")


@dataclass
class Report:
    expected: dict[str, int]
    stored: dict[str, int]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _scan(client: redis.Redis, key: str):
    return client.hscan_iter(key, count=1000)


def examine(client: redis.Redis, keys: Keys) -> Report:
    """Compare stored counters with those recomputed from the records."""
    groups = Counter[str]()
    for _, raw in _scan(client, keys.groups):
        groups[decode_group(raw).state] += 1
    reserved = 0
    current: set[str] = set()
    for _, raw in _scan(client, keys.episodes):
        e = decode_episode(raw)
        reserved += e.held
        if e.state == "active":
            current.add(e.aid)
    live: dict[str, set[str]] = {"running": set(), "doubtful": set()}
    for aid, raw in _scan(client, keys.attempts):
        a = decode_attempt(raw)
        if a.state in live:
            live[a.state].add(aid.decode())

    expected = {
        "reserved": reserved,
        "running": len(live["running"]),
        "doubtful": len(live["doubtful"]),
        "in_flight": groups["in_flight"] + groups["complete"],
        "accepted": groups["accepted"] + groups["delivered"] + groups["consumed"],
        "rejected": groups["rejected"],
        "consumed": groups["consumed"],
        "admitted": sum(groups.values()),
    }
    stored = {f.decode(): int(v) for f, v in client.hgetall(keys.counters).items()}
    report = Report(expected, stored)
    for name, value in expected.items():
        if stored.get(name, 0) != value:
            report.problems.append(f"{name}: stored {stored.get(name, 0)}, records say {value}")
    for name, value in sorted(stored.items()):
        if value < 0:
            report.problems.append(f"{name}: negative ({value})")
    for state, zkey in (("running", keys.leases), ("doubtful", keys.doubt)):
        members = {m.decode() for m in client.zrange(zkey, 0, -1)}
        if members != live[state]:
            report.problems.append(
                f"{zkey}: holds {len(members)} attempts, {len(live[state])} are {state}"
            )
        stray = live[state] - current
        if stray:
            report.problems.append(f"{len(stray)} {state} attempts are not their episode's current one")
    ready = client.llen(keys.ready)
    if ready != groups["accepted"]:
        report.problems.append(f"ready queue holds {ready}, {groups['accepted']} groups are accepted")
    return report


def repair(client: redis.Redis, keys: Keys) -> Report:
    """Rewrite the derived counters and the lease/doubt sets from the records."""
    report = examine(client, keys)
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.counters, mapping=report.expected)
    pipe.delete(keys.leases, keys.doubt)
    for aid, raw in _scan(client, keys.attempts):
        a = decode_attempt(raw)
        if a.state == "running" and a.lease is not None:
            pipe.zadd(keys.leases, {aid: a.lease})
        elif a.state == "doubtful" and a.doubt_at is not None:
            pipe.zadd(keys.doubt, {aid: a.doubt_at})
    pipe.execute()
    return report
