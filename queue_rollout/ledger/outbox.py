"""The outbox: attempts the ledger created whose RQ job is still to be enqueued.

``admit.lua`` and ``retry.lua`` push an attempt id to the outbox in the same atomic
step that reserves its slot, so a crash never loses an attempt. :func:`flush_outbox`
enqueues each one as an RQ job whose id *is* the attempt id and whose payload is that
id alone (JSON serializer), and removes it from the outbox in the same transaction.
An attempt placed on a replica (``rollout.placement = "group"``) goes to that
replica's queue, every other one to the farm's shared queue.
The jobs of one flush go to RQ in one round trip per chunk. A job is its id in RQ's
queue and nothing more: the episode worker runs the attempt the id names and reads no
job record, so none is written (nor RQ's registries, expirations and dependencies,
which the farm never reads). ``rq info`` shows the queue's length; RQ's tools show no
job details.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from queue_rollout.ledger.keys import Keys, rq_queue_key
from queue_rollout.ledger.records import decode_attempt


def episode_queue(client: redis.Redis, keys: Keys) -> Queue:
    """The farm's RQ queue of episode jobs (JSON serializer, never pickle)."""
    return Queue(keys.rq_queue, connection=client, serializer=JSONSerializer)


def placed_on(record: bytes | None) -> str | None:
    """The worker whose queue a queued attempt's job goes to (placement), None for the
    shared queue, or "" when the attempt is no longer queued (no job at all)."""
    if record is None:
        return ""
    attempt = decode_attempt(record)
    if attempt.state != "queued":
        return ""
    return attempt.placed_on or None


def flush_outbox(client: redis.Redis, keys: Keys, *, limit: int = 1000, chunk: int = 100) -> int:
    """Enqueue up to *limit* outbox attempts, *chunk* to a transaction (so the first jobs
    reach the workers before the last are built); returns how many were enqueued."""
    enqueued = 0
    for start in range(0, limit, chunk):
        ids = [raw.decode() for raw in client.lrange(keys.outbox, 0, min(chunk, limit - start) - 1)]
        if not ids:
            break
        enqueued += _enqueue(client, keys, ids)
    return enqueued


def _enqueue(client: redis.Redis, keys: Keys, ids: list[str]) -> int:
    """One transaction per chunk: the id of each attempt still queued goes to the tail
    of its RQ queue (the shared one, or the queue of the replica it is placed on), and
    every id leaves the outbox. Atomic, so a crash enqueues nothing twice; should two
    flushes race (a leader change), ``start.lua`` lets one claim win and the other job
    runs nothing."""
    by_queue: dict[str, list[str]] = {}
    for aid, record in zip(ids, client.hmget(keys.attempts, ids), strict=True):
        worker = placed_on(record)
        if worker == "":
            continue
        name = keys.rq_queue if worker is None else keys.rq_replica_queue(worker)
        by_queue.setdefault(name, []).append(aid)
    pipe = client.pipeline(transaction=True)
    for name, fresh in by_queue.items():
        pipe.sadd(Queue.redis_queues_keys, rq_queue_key(name))  # so that `rq info` lists it
        pipe.rpush(rq_queue_key(name), *fresh)
    for aid in ids:
        pipe.lrem(keys.outbox, 1, aid)
    pipe.execute()
    return sum(len(fresh) for fresh in by_queue.values())
