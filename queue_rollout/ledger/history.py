"""A group's story (``queue-rollout trace``), read from the history the ledger keeps.

``admit.lua`` gives each group it admits an entry in the history hash; the scripts that
change the group or one of its attempts afterwards append an event to it, a JSON object
on a line of its own (``history_add`` in ``_lib.lua``). The entries kept are those of
the last ``history.max_groups`` groups admitted within ``history.ttl_s``: admission
drops the oldest, and the history index (group id -> admitted at) says which are kept.

Events, each with ``e`` (its kind) and ``t`` (when, the ledger's clock):

- ``admitted``: ``v`` the policy version, ``G`` members, ``mode``.
- ``doubt``: attempt ``a`` (member ``m``, number ``n``) may or may not still run, ``c``
  the cause.
- ``revived``: doubtful attempt ``a`` reported progress: it runs on (doubt resolved).
- ``finished``: attempt ``a`` recorded its result, ``s`` ``finished`` or ``failed``
  (``why``: the reason it failed); ``w`` worker, ``r`` replica, ``st`` started at, ``v``
  the policy version it started under; ``late``: it was doubtful (a late result).
- ``retried``: attempt ``a`` ended without a result, ``res`` ``stopped`` (confirmed) or
  ``lost`` (doubt timed out), ``c`` the cause, ``ds`` doubtful since; ``next`` the new
  attempt of its member (none: that was its last attempt, the episode failed).
- ``judged``: ``ok`` accepted, else ``reason`` and ``why`` (the rule's words).
- ``delivered``: in batch ``b`` to consumer ``c`` under policy version ``v``; ``re``
  redelivered (its earlier batch was released from its consumer).
- ``acked``: consumer ``c`` acknowledged batch ``b``.

An attempt that has not ended has no event that says where it runs: its live record in
the attempts hash (kept until the group is judged rejected or consumed) says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import redis

from queue_rollout.errors import BadInput
from queue_rollout.ledger.connection import client_url, translate_errors
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.records import AttemptRecord, decode_attempt, decode_group

#: How a doubt ended: the attempt reported again, its result came, its stop was
#: confirmed, or the doubt timed out.
RESOLUTIONS = {"reported": "it reported again and ran on",
               "late_result": "its late result was recorded",
               "stopped": "its stop was confirmed",
               "lost": "declared lost (the doubt timed out)"}


class Doubt(msgspec.Struct):
    since: float
    cause: str
    resolved_at: float | None = None
    #: one of :data:`RESOLUTIONS`; None while the doubt lasts
    resolution: str | None = None


class AttemptStory(msgspec.Struct):
    attempt: str
    member: int
    number: int
    #: queued, running, doubtful (not ended); finished, failed, stopped, lost (ended)
    state: str
    worker: str | None = None
    replica: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    #: the policy version it started under
    version: int | None = None
    #: ended without a result: why (lease_expired, worker_lost, replica_restart, ...)
    cause: str | None = None
    #: ended without a result: ``stopped`` (confirmed) or ``lost`` (doubt timed out)
    resolution: str | None = None
    #: failed with a result: why (workflow, oversized)
    failed_reason: str | None = None
    #: the member's next attempt, when this one was retried
    retried_as: str | None = None
    doubts: list[Doubt] = msgspec.field(default_factory=list)


class Judgement(msgspec.Struct):
    at: float
    accepted: bool
    reason: str | None = None
    detail: str | None = None


class Handover(msgspec.Struct):
    at: float
    batch: str
    consumer: str
    #: delivered: the policy version of the batch
    version: int | None = None
    redelivered: bool = False


class GroupStory(msgspec.Struct):
    group: str
    #: the group's state in the ledger now (in_flight, complete, accepted, delivered,
    #: consumed, rejected)
    state: str
    admitted_at: float
    version: int
    members: int
    mode: str
    attempts: list[AttemptStory]
    judged: Judgement | None
    deliveries: list[Handover]
    acked: Handover | None
    #: the events as recorded, oldest first
    events: list[dict[str, Any]]


def _open_doubt(attempt: AttemptStory) -> Doubt | None:
    last = attempt.doubts[-1] if attempt.doubts else None
    return last if last is not None and last.resolution is None else None


def _resolve(attempt: AttemptStory, at: float, resolution: str,
             since: float | None = None, cause: str = "") -> None:
    doubt = _open_doubt(attempt)
    if doubt is None and since is not None:  # doubted before its story began
        doubt = Doubt(since=since, cause=cause)
        attempt.doubts.append(doubt)
    if doubt is not None:
        doubt.resolved_at, doubt.resolution = at, resolution


def build_story(group_id: str, events: list[dict[str, Any]], *, state: str = "unknown",
                live: Sequence[tuple[str, AttemptRecord]] = ()) -> GroupStory:
    """The story of *events* (the first one ``admitted``); *live*: (attempt id,
    :class:`~queue_rollout.ledger.records.AttemptRecord`) of attempts still on record,
    for those that have not ended."""
    first = events[0]
    attempts: dict[str, AttemptStory] = {}
    judged: Judgement | None = None
    deliveries: list[Handover] = []
    acked: Handover | None = None

    def attempt(e: dict[str, Any]) -> AttemptStory:
        aid = str(e["a"])
        if aid not in attempts:
            attempts[aid] = AttemptStory(aid, int(e.get("m", -1)), int(e.get("n", 0)),
                                         "running")
        return attempts[aid]

    for e in events[1:]:
        kind, at = e.get("e"), float(e.get("t", 0.0))
        if kind == "doubt":
            a = attempt(e)
            a.state = "doubtful"
            a.doubts.append(Doubt(since=at, cause=str(e.get("c", ""))))
        elif kind == "revived":
            a = attempt(e)
            a.state = "running"
            _resolve(a, at, "reported")
        elif kind in ("finished", "retried"):
            a = attempt(e)
            a.worker, a.replica = e.get("w"), e.get("r")
            a.started_at, a.ended_at, a.version = e.get("st"), at, e.get("v")
            if kind == "finished":
                a.state = str(e.get("s", "finished"))
                a.failed_reason = e.get("why")
                if e.get("late"):
                    _resolve(a, at, "late_result")
            else:
                a.resolution, a.cause = e.get("res"), e.get("c")
                a.retried_as = e.get("next")
                a.state = str(a.resolution) if a.retried_as else "failed"
                if e.get("ds") is not None:
                    _resolve(a, at, str(a.resolution), float(e["ds"]), str(a.cause or ""))
        elif kind == "judged":
            judged = Judgement(at, bool(e.get("ok")), e.get("reason"), e.get("why"))
        elif kind == "delivered":
            deliveries.append(Handover(at, str(e.get("b")), str(e.get("c")), e.get("v"),
                                       bool(e.get("re"))))
        elif kind == "acked":
            acked = Handover(at, str(e.get("b")), str(e.get("c")))
    for aid, rec in live:
        if aid in attempts and attempts[aid].ended_at is not None:
            continue
        a = attempts.setdefault(aid, AttemptStory(aid, rec.member, rec.number, rec.state))
        a.state, a.worker, a.replica = rec.state, rec.worker, rec.replica
        a.started_at, a.version = rec.started_at, rec.version
        if rec.state == "doubtful" and _open_doubt(a) is None and rec.doubt_at is not None:
            a.doubts.append(Doubt(since=rec.doubt_at, cause=rec.cause or ""))
    return GroupStory(
        group=group_id, state=state, admitted_at=float(first.get("t", 0.0)),
        version=int(first.get("v", 0)), members=int(first.get("G", 0)),
        mode=str(first.get("mode", "")),
        attempts=sorted(attempts.values(), key=lambda a: (a.member, a.number)),
        judged=judged, deliveries=deliveries, acked=acked, events=events)


def read_story(client: redis.Redis, keys: Keys, group_id: str, *, ttl_s: float,
               now: float | None = None) -> GroupStory:
    """Group *group_id*'s story; :class:`~queue_rollout.errors.BadInput` saying why
    when the farm keeps none (unknown, not admitted yet, or no longer kept)."""
    now = time.time() if now is None else now
    url = client_url(client)
    pipe = client.pipeline(transaction=True)
    pipe.hget(keys.history, group_id)
    pipe.zscore(keys.history_index, group_id)
    pipe.hget(keys.groups, group_id)
    with translate_errors(url):
        raw, admitted_at, group_raw = pipe.execute()
    group = decode_group(group_raw) if group_raw else None
    if raw is None or admitted_at is None or now - float(admitted_at) >= ttl_s:
        if group is not None:
            raise BadInput(
                f"group {group_id!r}: its story is not kept (the farm keeps those of the "
                "last history.max_groups groups admitted within history.ttl_s seconds, "
                f"none with max_groups = 0); the ledger knows it as {group.state}, "
                f"admitted {_when(group.admitted_at)}")
        with translate_errors(url):
            pending = client.hexists(keys.prompts, group_id)
        if pending:
            raise BadInput(f"group {group_id!r}: submitted, not admitted yet: its story "
                           "begins at its admission")
        raise BadInput(f"group {group_id!r}: unknown to farm {keys.farm} (never "
                       "submitted, or its story and record are gone)")
    events = [json.loads(line) for line in raw.decode().split("\n") if line]
    live: list[tuple[str, AttemptRecord]] = []
    if group is not None and group.state in ("in_flight", "complete"):
        aids = group.attempt_ids
        with translate_errors(url):
            records = client.hmget(keys.attempts, aids)
        live = [(aid, decode_attempt(rec)) for aid, rec in zip(aids, records, strict=True)
                if rec]
    return build_story(group_id, events, state=group.state if group else "unknown",
                       live=live)


def _when(at: float) -> str:
    """Local date and time to the millisecond."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"


def story_text(story: GroupStory) -> str:
    """The story for people: times after admission as ``+seconds``."""
    t0 = story.admitted_at

    def rel(at: float | None) -> str:
        return "?" if at is None else f"+{at - t0:.3f}s"

    lines = [f"group {story.group}: {story.state}",
             f"  admitted   {_when(t0)} under policy version {story.version}; "
             f"{story.members} members, {story.mode} mode"]
    member = None
    for a in story.attempts:
        head = "  member" + f" {a.member}".ljust(5) if a.member != member else " " * 13
        member = a.member
        where = f"worker {a.worker}, replica {a.replica}" if a.worker else "not started"
        version = f", policy version {a.version}" if a.version is not None else ""
        lines.append(f"{head}attempt {a.number} {a.attempt}: {where}{version}")
        steps = [f"started {rel(a.started_at)}"] if a.started_at is not None else []
        if a.ended_at is None:
            steps.append(f"{a.state} now")
        elif a.state in ("finished", "failed") and a.resolution is None:
            notes = [a.failed_reason] if a.failed_reason else []
            if a.started_at is not None:
                notes.append(f"ran {a.ended_at - a.started_at:.3f}s")
            steps.append(f"{a.state} {rel(a.ended_at)}"
                         + (f" ({'; '.join(notes)})" if notes else ""))
        else:
            how = "stop confirmed" if a.resolution == "stopped" else "declared lost"
            then = (f"retried as attempt {a.number + 1} {a.retried_as}" if a.retried_as
                    else "its last attempt: the member failed")
            steps.append(f"ended {rel(a.ended_at)} without a result ({how}, cause "
                         f"{a.cause}); {then}")
        lines.append(" " * 15 + ", ".join(steps))
        for d in a.doubts:
            end = (f"resolved {rel(d.resolved_at)}: {RESOLUTIONS.get(d.resolution, d.resolution)}"
                   if d.resolution else "unresolved")
            lines.append(" " * 15 + f"doubtful {rel(d.since)} ({d.cause}), {end}")
    if story.judged is not None:
        j = story.judged
        verdict = "accepted" if j.accepted else f"rejected: {j.reason}" + (
            f" ({j.detail})" if j.detail else "")
        lines.append(f"  judged     {rel(j.at)} {verdict}")
    for h in story.deliveries:
        again = ", redelivered" if h.redelivered else ""
        lines.append(f"  delivered  {rel(h.at)} in batch {h.batch} to consumer {h.consumer} "
                     f"(policy version {h.version}{again})")
    if story.acked is not None:
        lines.append(f"  acked      {rel(story.acked.at)} by consumer {story.acked.consumer} "
                     f"(batch {story.acked.batch})")
    return "\n".join(lines)


def story_json(story: GroupStory) -> str:
    """The story as one JSON object."""
    return msgspec.json.encode(story).decode()
