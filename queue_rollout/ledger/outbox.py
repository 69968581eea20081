"""The outbox: attempts the ledger created whose RQ job is still to be enqueued.

``admit.lua`` and ``retry.lua`` push an attempt id to the outbox in the same atomic
step that reserves its slot, so a crash never loses an attempt. :func:`flush_outbox`
enqueues each one as an RQ job whose id *is* the attempt id and whose payload is that
id alone (JSON serializer), and removes it from the outbox in the same transaction.
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

from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.records import decode_attempt


def episode_queue(client: redis.Redis, keys: Keys) -> Queue:
    """The farm's RQ queue of episode jobs (JSON serializer, never pickle)."""
    return Queue(keys.rq_queue, connection=client, serializer=JSONSerializer)


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
    """One transaction per chunk: the id of each attempt still queued goes to the RQ
    queue's tail, and every id leaves the outbox. Atomic, so a crash enqueues nothing
    twice; should two flushes race (a leader change), ``start.lua`` lets one claim win
    and the other job runs nothing."""
    records = client.hmget(keys.attempts, ids)
    fresh = [aid for aid, record in zip(ids, records, strict=True)
             if record is not None and decode_attempt(record).state == "queued"]
    queue = episode_queue(client, keys)
    pipe = client.pipeline(transaction=True)
    if fresh:
        pipe.sadd(queue.redis_queues_keys, queue.key)  # so that `rq info` lists it
        pipe.rpush(queue.key, *fresh)
    for aid in ids:
        pipe.lrem(keys.outbox, 1, aid)
    pipe.execute()
    return len(fresh)
