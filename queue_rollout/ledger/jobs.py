"""The farm's job queues: how an admitted attempt reaches a worker, and what happens to
its job until the attempt ends.

An attempt's job is its id in an RQ queue: the farm's shared queue, or, in a farm
placing groups (``rollout.placement = "group"``), the queue of the worker its group is
placed on. The job is the id alone: no job record, registry or result is written (the
worker runs the attempt the id names and reads nothing else), and the payload is never
unpickled. Every step a job goes through is here:

- **The outbox.** ``admit.lua`` and ``retry.lua`` push an attempt to the outbox in the
  same atomic step that reserves its slot, as ``aid@worker`` (placed on *worker*) or
  ``aid@`` (the shared queue), so a crash never loses an attempt. A script cannot name
  in KEYS a worker's queue it only chooses while it runs, so a relay moves the entries:
  :func:`flush_outbox` (the collector) pushes each id to the queue its entry names and
  takes the entries off the outbox in one transaction, reading nothing else. An entry
  without ``@`` was written by a release before the entries said their queue: its
  attempt record says it (the one read the relay still makes for it). ``move.lua``
  pushes itself: its caller names the queues.
- **The take** (a worker process, :meth:`WorkerQueues.take`): the ids of its jobs whose
  attempts ended leave RQ's intermediate list, and the next id moves from the queue to
  that list, in one round trip.
- **The give-back** (:meth:`WorkerQueues.give_back`): a job taken just as the process
  stopped goes back to the front of the shared queue.
- **The lost-job scan** (the reconciler, :func:`requeue_lost`): a queued attempt whose
  job is in neither the outbox nor its queue goes to the outbox again;
  :func:`sweep_intermediate` takes off RQ's intermediate list the jobs of attempts that
  ended under a worker that died.

``start.lua`` lets one claim of an attempt win, so a job that exists twice (a relay
and a reconciler racing, a leader change, or ``move.lua`` moving an attempt whose entry
still waits in the outbox, which the relay then also pushes to the worker's queue it
names) runs the attempt once; the copy that loses is counted as ignored.

A relay of a release before the entries named their queue reads ``aid@...`` as an
attempt id it does not know and drops it: in a rolling upgrade the collectors go
first, then the nodes (whose ``retry`` calls write the new entries).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis
from rq import Queue
from rq.intermediate_queue import IntermediateQueue
from rq.serializers import JSONSerializer

from queue_rollout.ledger.keys import Keys, rq_queue_key
from queue_rollout.ledger.records import decode_attempt

#: Attempt states whose job may rightly sit in RQ's intermediate list (a worker holds it).
LIVE_OR_QUEUED = frozenset({"queued", "running", "doubtful"})


def episode_queue(client: redis.Redis, keys: Keys) -> Queue:
    """The farm's shared RQ queue of episode jobs (JSON serializer, never pickle)."""
    return Queue(keys.rq_queue, connection=client, serializer=JSONSerializer)


def intermediate_of(keys: Keys) -> str:
    """RQ's intermediate list of the farm's jobs: those a worker has taken."""
    return IntermediateQueue.get_intermediate_queue_key(rq_queue_key(keys.rq_queue))


def outbox_entry(aid: str, placed_on: str | None) -> str:
    """The outbox entry of queued attempt *aid* (as ``_lib.lua``'s ``outbox_entry``)."""
    return f"{aid}@{placed_on or ''}"


def _entry_id(entry: str) -> str:
    return entry.partition("@")[0]


def queue_of(keys: Keys, placed_on: str | None) -> str:
    """The Redis list a queued attempt's job waits in: its worker's queue, or the
    shared one."""
    return rq_queue_key(keys.rq_replica_queue(placed_on) if placed_on else keys.rq_queue)


def placed_on(record: bytes | None) -> str | None:
    """The worker whose queue a queued attempt's job goes to (placement), None for the
    shared queue, or "" when the attempt is no longer queued (no job at all)."""
    if record is None:
        return ""
    attempt = decode_attempt(record)
    if attempt.state != "queued":
        return ""
    return attempt.placed_on or None


def outbox_ids(client: redis.Redis, keys: Keys) -> set[str]:
    """The attempt ids the outbox holds."""
    return {_entry_id(raw.decode()) for raw in client.lrange(keys.outbox, 0, -1)}


def flush_outbox(client: redis.Redis, keys: Keys, *, limit: int = 1000,
                 chunk: int = 100) -> int:
    """Enqueue up to *limit* outbox attempts, *chunk* to a transaction (so the first
    jobs reach the workers before the last are built); returns how many were
    enqueued."""
    enqueued = 0
    for start in range(0, limit, chunk):
        entries = [raw.decode() for raw in
                   client.lrange(keys.outbox, 0, min(chunk, limit - start) - 1)]
        if not entries:
            break
        enqueued += _enqueue(client, keys, entries)
    return enqueued


def _enqueue(client: redis.Redis, keys: Keys, entries: list[str]) -> int:
    """One transaction per chunk: each attempt's id goes to the tail of the queue its
    entry names, and every entry leaves the outbox. Atomic, so a crash enqueues
    nothing twice; should two flushes race (a leader change), ``start.lua`` lets one
    claim win and the other job runs nothing."""
    by_queue: dict[str, list[str]] = {}
    legacy = [e for e in entries if "@" not in e]
    records = dict(zip(legacy, client.hmget(keys.attempts, legacy), strict=True)) if legacy else {}
    for entry in entries:
        aid, at, worker = entry.partition("@")
        if at:  # the entry names the queue: the worker's, or "" for the shared one
            target: str | None = worker or None
        else:  # a plain id: its record says, and an attempt no longer queued has no job
            target = placed_on(records[entry])
            if target == "":
                continue
        by_queue.setdefault(queue_of(keys, target), []).append(aid)
    pipe = client.pipeline(transaction=True)
    for key, fresh in by_queue.items():
        pipe.sadd(Queue.redis_queues_keys, key)  # so that `rq info` lists it
        pipe.rpush(key, *fresh)
    for entry in entries:
        pipe.lrem(keys.outbox, 1, entry)
    pipe.execute()
    return sum(len(fresh) for fresh in by_queue.values())


@dataclass(frozen=True)
class WorkerQueues:
    """The queues one worker process takes jobs from: the shared queue and, in a farm
    placing groups, its own; RQ's intermediate list holds the jobs it has taken."""

    shared: str
    intermediate: str
    own: str | None = None

    @classmethod
    def of(cls, keys: Keys, worker_id: str, *, placing: bool) -> WorkerQueues:
        return cls(queue_of(keys, None), intermediate_of(keys),
                   queue_of(keys, worker_id) if placing else None)

    def take(self, pipe: redis.client.Pipeline, ended: Iterable[str], *,
             wait_s: float | None, shared: bool = False) -> None:
        """Queue on *pipe* the take: the jobs of *ended* attempts leave the intermediate
        list, then the next id moves there from the own queue (the shared one with
        *shared*, or without an own queue), waiting up to *wait_s* (None: not at all).
        The id taken, or None, is the pipeline's last reply."""
        for aid in ended:
            pipe.lrem(self.intermediate, 1, aid)
        source = self.shared if shared or self.own is None else self.own
        if wait_s is None:
            pipe.lmove(source, self.intermediate, "LEFT", "RIGHT")
        else:
            pipe.blmove(source, self.intermediate, wait_s, "LEFT", "RIGHT")

    def clear(self, client: redis.Redis, ended: Sequence[str]) -> None:
        """The jobs of *ended* attempts leave the intermediate list (what is left there,
        :func:`sweep_intermediate` clears)."""
        if ended:
            pipe = client.pipeline(transaction=False)
            for aid in ended:
                pipe.lrem(self.intermediate, 1, aid)
            pipe.execute()

    def give_back(self, client: redis.Redis, aid: str) -> None:
        """A job taken but not run goes back to the front of the shared queue."""
        pipe = client.pipeline(transaction=True)
        pipe.lrem(self.intermediate, 1, aid)
        pipe.lpush(self.shared, aid)
        pipe.execute()


def requeue_lost(client: redis.Redis, keys: Keys, queued_before: float) -> list[str]:
    """Queued attempts created before *queued_before* whose RQ job is gone: in neither
    its queue nor the outbox (lost with a Redis crash, or taken by a worker that died
    before it started the attempt: stranded in RQ's intermediate list). Each goes to
    the outbox again; returns their ids.

    Each suspect is checked in the order that makes the check race-free: the outbox
    (the relay enqueues the job in the transaction that takes it off the outbox), then
    the queue, then the attempt again (a job taken since has started it). A job a live
    worker took just now may be enqueued twice: ``start`` lets one claim win."""
    in_outbox = outbox_ids(client, keys)
    intermediate = intermediate_of(keys)
    requeued = []
    for raw, record in client.hscan_iter(keys.attempts, count=1000):
        aid = raw.decode()
        attempt = decode_attempt(record)
        if (aid in in_outbox or attempt.state != "queued"
                or attempt.created_at > queued_before):
            continue
        entry = outbox_entry(aid, attempt.placed_on)
        if (client.lpos(keys.outbox, entry) is not None
                or client.lpos(keys.outbox, aid) is not None
                or client.lpos(queue_of(keys, attempt.placed_on), aid) is not None):
            continue  # admitted after the snapshot, or waiting in its queue
        now_record = client.hget(keys.attempts, aid)
        if now_record is None or decode_attempt(now_record).state != "queued":
            continue  # its job started it meanwhile
        pipe = client.pipeline(transaction=True)
        pipe.lrem(intermediate, 0, aid)
        pipe.rpush(keys.outbox, entry)
        pipe.execute()
        requeued.append(aid)
    return requeued


def sweep_intermediate(client: redis.Redis, keys: Keys) -> None:
    """Jobs left in RQ's intermediate list by a worker that died after its attempt
    ended (or that named no attempt): taken off it, their records deleted."""
    intermediate = intermediate_of(keys)
    ids = [raw.decode() for raw in client.lrange(intermediate, 0, -1)]
    if not ids:
        return
    records = client.hmget(keys.attempts, ids)
    gone = [aid for aid, raw in zip(ids, records, strict=True)
            if raw is None or decode_attempt(raw).state not in LIVE_OR_QUEUED]
    if gone:
        pipe = client.pipeline(transaction=False)
        for aid in gone:
            pipe.lrem(intermediate, 0, aid)
            pipe.delete(f"rq:job:{aid}")
        pipe.execute()
