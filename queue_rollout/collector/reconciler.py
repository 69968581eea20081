"""The reconciler: marks doubt and applies the doubt timeout.

The collector ticks it. It never decides that an attempt stopped (only the replica's
node can confirm that, see ``workers/resolver.py``); it only notices what may have
gone wrong and says so:

- a running attempt whose lease expired becomes doubtful (``lease_expired``);
- a queued attempt with no RQ job waiting (neither in the outbox nor in RQ's queue: lost
  with Redis's data, or taken by a worker that died before it started the attempt) is
  handed to the outbox again: nothing ran, so nothing is in doubt. Only attempts queued
  for longer than a lease are looked at: a lost job is rare and not urgent, and a farm
  with a deep queue would otherwise pay a few round trips per queued attempt on every
  scan. Jobs left in RQ's intermediate list after their attempt ended are swept;
- an attempt doubtful for longer than ``timeouts.doubt`` is declared lost and retried,
  loudly (a warning and ``retries:doubt_timeout``); a late result from it is ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rq import Queue

from queue_rollout.config import Config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.outbox import episode_queue
from queue_rollout.ledger.records import decode_attempt

log = logging.getLogger(__name__)
#: Attempt states whose job may rightly sit in RQ's intermediate list (a worker holds it).
LIVE_OR_QUEUED = frozenset({"queued", "running", "doubtful"})


@dataclass
class TickReport:
    doubted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, ledger: Ledger, config: Config) -> None:
        self.ledger = ledger
        self.config = config

    def tick(self, *, scan_jobs: bool = True) -> TickReport:
        """One pass. *scan_jobs* reads every attempt record: the collector does it less
        often than the cheap lease and doubt checks."""
        report = TickReport()
        ledger, keys = self.ledger, self.ledger.keys
        now = ledger.clock()
        for raw in ledger.client.zrangebyscore(keys.leases, "-inf", now):
            aid = raw.decode()
            if ledger.mark_doubtful(aid, "lease_expired").status == "doubtful":
                log.warning("attempt %s: lease expired, now doubtful", aid)
                report.doubted.append(aid)
        doubt_s = self.config.timeouts.doubt
        for raw in ledger.client.zrangebyscore(keys.doubt, "-inf", now - doubt_s):
            aid = raw.decode()
            answer = ledger.retry(aid, cause="doubt_timeout", resolution="lost", doubt_s=doubt_s)
            if not answer.ignored:
                log.warning("attempt %s: doubtful for over %ss, declared lost: %s %s",
                            aid, doubt_s, answer.status, answer.attempt_id)
                report.lost.append(aid)
        if scan_jobs:
            report.requeued = self._requeue_lost_jobs()
        return report

    def _requeue_lost_jobs(self) -> list[str]:
        """Queued attempts whose RQ job is gone: in neither RQ's queue nor the outbox
        (lost with a Redis crash, or taken by a worker that died before it started the
        attempt: stranded in RQ's intermediate list). Handed to the outbox again.

        Each suspect is checked in the order that makes the check race-free: the outbox
        (flush enqueues the job in the transaction that takes it off the outbox), then
        the queue, then the attempt again (a job taken since has started it). A job a
        live worker took just now may be enqueued twice: ``start`` lets one claim win.
        Then RQ's intermediate list is swept of jobs whose attempt has ended."""
        keys, client = self.ledger.keys, self.ledger.client
        queue = episode_queue(client, keys)
        in_outbox = {raw.decode() for raw in client.lrange(keys.outbox, 0, -1)}
        queued_before = self.ledger.clock() - self.config.timeouts.lease
        requeued = []
        for raw, record in client.hscan_iter(keys.attempts, count=1000):
            aid = raw.decode()
            attempt = decode_attempt(record)
            if (aid in in_outbox or attempt.state != "queued"
                    or attempt.created_at > queued_before):
                continue
            if client.lpos(keys.outbox, aid) is not None or client.lpos(queue.key, aid) is not None:
                continue  # admitted after the snapshot, or waiting in RQ's queue
            now_record = client.hget(keys.attempts, aid)
            if now_record is None or decode_attempt(now_record).state != "queued":
                continue  # its job started it meanwhile
            pipe = client.pipeline(transaction=True)
            pipe.lrem(queue.intermediate_queue_key, 0, aid)
            pipe.rpush(keys.outbox, aid)
            pipe.execute()
            log.warning("attempt %s: its RQ job was lost; handed to the outbox again", aid)
            requeued.append(aid)
        self._sweep_intermediate(queue)
        return requeued

    def _sweep_intermediate(self, queue: Queue) -> None:
        """Jobs left in RQ's intermediate list by a worker that died after its attempt
        ended (or that named no attempt): taken off it, their records deleted."""
        client, keys = self.ledger.client, self.ledger.keys
        ids = [raw.decode() for raw in client.lrange(queue.intermediate_queue_key, 0, -1)]
        if not ids:
            return
        records = client.hmget(keys.attempts, ids)
        gone = [aid for aid, raw in zip(ids, records, strict=True)
                if raw is None or decode_attempt(raw).state not in LIVE_OR_QUEUED]
        if gone:
            pipe = client.pipeline(transaction=False)
            for aid in gone:
                pipe.lrem(queue.intermediate_queue_key, 0, aid)
                pipe.delete(f"rq:job:{aid}")
            pipe.execute()
