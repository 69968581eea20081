"""The outbox: attempts the ledger created whose RQ job is still to be enqueued.

``admit.lua`` and ``retry.lua`` push an attempt id to the outbox in the same atomic
step that reserves its slot, so a crash never loses an attempt. :func:`flush_outbox`
enqueues each one as an RQ job whose id *is* the attempt id and whose payload is that
id alone (JSON serializer), then removes it from the outbox. A crash between the two
leaves the id in the outbox; the next flush finds the job already there (RQ's
``unique`` enqueue, atomic) or the attempt no longer queued, and enqueues nothing
twice. Should a job still run twice, ``start.lua`` lets only one claim win.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.exceptions import DuplicateJobError
from rq.serializers import JSONSerializer

from .keys import EPISODE_JOB_FUNC, Keys
from .records import decode_attempt

#: Finished job hashes are kept this long (seconds) so a late re-flush sees them.
JOB_RESULT_TTL = 24 * 3600


def episode_queue(client: redis.Redis, keys: Keys) -> Queue:
    """The farm's RQ queue of episode jobs (JSON serializer, never pickle)."""
    return Queue(keys.rq_queue, connection=client, serializer=JSONSerializer)


def flush_outbox(client: redis.Redis, keys: Keys, *, limit: int = 1000) -> int:
    """Enqueue up to *limit* outbox attempts; returns how many jobs were enqueued."""
    queue = episode_queue(client, keys)
    enqueued = 0
    for raw in client.lrange(keys.outbox, 0, limit - 1):
        aid = raw.decode()
        record = client.hget(keys.attempts, aid)
        if record is not None and decode_attempt(record).state == "queued":
            try:
                queue.enqueue_call(
                    EPISODE_JOB_FUNC, args=(aid,), job_id=aid, unique=True,
                    timeout=-1, result_ttl=JOB_RESULT_TTL, failure_ttl=JOB_RESULT_TTL,
                    description=f"episode attempt {aid}",
                )
                enqueued += 1
            except DuplicateJobError:
                pass
        client.lrem(keys.outbox, 1, aid)
    return enqueued
