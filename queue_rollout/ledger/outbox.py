"""The outbox: attempts the ledger created whose RQ job is still to be enqueued.

``admit.lua`` and ``retry.lua`` push an attempt id to the outbox in the same atomic
step that reserves its slot, so a crash never loses an attempt. :func:`flush_outbox`
enqueues each one as an RQ job whose id *is* the attempt id and whose payload is that
id alone (JSON serializer), then removes it from the outbox. A crash between the two
leaves the id in the outbox; the next flush finds the job already there or the attempt
no longer queued, and enqueues nothing twice. The jobs of one flush go to RQ in one
pipeline (a deep outbox costs one round trip, not one per job); should two flushes
race (a leader change) and a job still be enqueued twice, ``start.lua`` lets only one
claim win.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from queue_rollout.ledger.keys import EPISODE_JOB_FUNC, Keys
from queue_rollout.ledger.records import decode_attempt

#: RQ keeps a finished or failed episode job (its status, for `rq info`) this long, in
#: seconds. Correctness does not need it: a job that ran has started its attempt, and
#: the outbox and the reconciler only (re-)enqueue attempts still queued.
JOB_RESULT_TTL = 3600


def episode_queue(client: redis.Redis, keys: Keys) -> Queue:
    """The farm's RQ queue of episode jobs (JSON serializer, never pickle)."""
    return Queue(keys.rq_queue, connection=client, serializer=JSONSerializer)


def flush_outbox(client: redis.Redis, keys: Keys, *, limit: int = 1000, chunk: int = 100) -> int:
    """Enqueue up to *limit* outbox attempts, *chunk* to a pipeline (so the first jobs
    reach the workers before the last are built); returns how many were enqueued."""
    enqueued = 0
    for start in range(0, limit, chunk):
        ids = [raw.decode() for raw in client.lrange(keys.outbox, 0, min(chunk, limit - start) - 1)]
        if not ids:
            break
        enqueued += _enqueue(client, keys, ids)
    return enqueued


def _enqueue(client: redis.Redis, keys: Keys, ids: list[str]) -> int:
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.attempts, ids)
    for aid in ids:
        pipe.exists(Job.key_for(aid))
    records, *exists = pipe.execute()
    fresh = [aid for aid, record, there in zip(ids, records, exists, strict=True)
             if record is not None and not there and decode_attempt(record).state == "queued"]
    if fresh:
        episode_queue(client, keys).enqueue_many([Queue.prepare_data(
            EPISODE_JOB_FUNC, args=(aid,), job_id=aid, timeout=-1,
            result_ttl=JOB_RESULT_TTL, failure_ttl=JOB_RESULT_TTL,
            description=f"episode attempt {aid}") for aid in fresh])
    pipe = client.pipeline(transaction=False)  # only once every job is in RQ
    for aid in ids:
        pipe.lrem(keys.outbox, 1, aid)
    pipe.execute()
    return len(fresh)
