"""The reconciler: marks doubt and applies the doubt timeout.

The collector ticks it. It never decides that an attempt stopped (only the replica's
node can confirm that, see ``workers/resolver.py``); it only notices what may have
gone wrong and says so:

- a running attempt whose lease expired becomes doubtful (``lease_expired``);
- a queued attempt with no RQ job anywhere (neither in the outbox nor in RQ, or a job
  marked queued that is in no queue: taken by a worker that lost Redis before it
  started the attempt) is handed to the outbox again: nothing ran, so nothing is in
  doubt. Only attempts queued for
  longer than a lease are looked at: a lost job is rare (RQ's data lost with Redis)
  and not urgent, and a farm with a deep queue would otherwise pay a few round trips
  per queued attempt on every scan;
- an attempt doubtful for longer than ``timeouts.doubt`` is declared lost and retried,
  loudly (a warning and ``retries:doubt_timeout``); a late result from it is ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from queue_rollout.config import Config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.outbox import episode_queue
from queue_rollout.ledger.records import decode_attempt

log = logging.getLogger(__name__)


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
        """Queued attempts whose RQ job vanished (or ended without starting them).

        Each suspect is checked in the order that makes the check race-free: the
        outbox first (flush enqueues the job before it leaves the outbox, so an attempt
        not in the outbox has had its job), then the job, then the attempt again (a
        job that ran has started its attempt before it ended)."""
        keys, client = self.ledger.keys, self.ledger.client
        in_outbox = {raw.decode() for raw in client.lrange(keys.outbox, 0, -1)}
        queued_before = self.ledger.clock() - self.config.timeouts.lease
        requeued = []
        for raw, record in client.hscan_iter(keys.attempts, count=1000):
            aid = raw.decode()
            attempt = decode_attempt(record)
            if (aid in in_outbox or attempt.state != "queued"
                    or attempt.created_at > queued_before):
                continue
            if client.lpos(keys.outbox, aid) is not None:
                continue  # admitted after the snapshot: not flushed yet
            job = (Job.fetch(aid, connection=client, serializer=JSONSerializer)
                   if Job.exists(aid, client) else None)
            if job is not None and not (job.is_finished or job.is_failed or job.is_stopped
                                        or job.is_canceled or self._orphaned(job)):
                continue  # waiting in RQ, or being picked up
            now_record = client.hget(keys.attempts, aid)
            if now_record is None or decode_attempt(now_record).state != "queued":
                continue  # its job started it meanwhile
            if job is not None:
                job.delete()
            client.rpush(keys.outbox, aid)
            log.warning("attempt %s: its RQ job was lost; handed to the outbox again", aid)
            requeued.append(aid)
        return requeued

    def _orphaned(self, job: Job) -> bool:
        """A job still marked queued that is in no queue: taken by a worker that lost
        Redis (or its process) between taking it and starting it, e.g. stranded in
        RQ's intermediate queue by a Redis crash."""
        if job.get_status(refresh=False) != JobStatus.QUEUED:
            return False
        queue = episode_queue(self.ledger.client, self.ledger.keys)
        return self.ledger.client.lpos(queue.key, job.id) is None
