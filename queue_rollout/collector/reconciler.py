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

A farm that places groups (``rollout.placement = "group"``) has two more jobs here:

- the workers admission may place on follow the registry's live workers and their
  slots (a worker gone leaves at once, one back or new enters);
- an attempt placed on a replica that has not started it within
  ``rollout.placement_wait_s``, or whose worker is gone, moves to the shared queue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from queue_rollout.config import Config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.jobs import placed_on, requeue_lost, sweep_intermediate
from queue_rollout.ledger.keys import rq_queue_key

log = logging.getLogger(__name__)
@dataclass
class TickReport:
    doubted: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    moved: int = 0  # placed attempts moved to the shared queue


class Reconciler:
    def __init__(self, ledger: Ledger, config: Config) -> None:
        self.ledger = ledger
        self.config = config

    def tick(self, *, scan_jobs: bool = True,
             live_workers: dict[str, dict[str, Any]] | None = None) -> TickReport:
        """One pass. *scan_jobs* reads every attempt record: the collector does it less
        often than the cheap lease and doubt checks. *live_workers* (the registry's, by
        worker id): a farm that places groups does its placement work with them (None:
        not this time)."""
        report = TickReport()
        if self.config.rollout.placement == "group" and live_workers is not None:
            report.moved = self._place(live_workers)
        ledger, keys = self.ledger, self.ledger.keys
        now = ledger.clock()
        for aid in ledger.expire_leases():
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

    def _place(self, live_workers: dict[str, dict[str, Any]]) -> int:
        """Placeable workers follow the live ones; attempts waiting too long on a
        replica, or on one whose worker is gone, move to the shared queue."""
        ledger = self.ledger
        live = {w: int(r.get("slots", 0)) for w, r in live_workers.items()}
        placeable = ledger.replica_slots()
        changes = {w: n for w, n in live.items() if placeable.get(w) != n}
        gone = [w for w in placeable if w not in live]
        changes.update(dict.fromkeys(gone, 0))
        if changes:
            ledger.set_replicas(changes)
            for w in gone:
                log.warning("worker %s is gone: no more groups are placed on it", w)
        stale = set(ledger.placed_before(ledger.clock() - self.config.rollout.placement_wait_s))
        client, keys = ledger.client, ledger.keys
        for w in gone:  # all that waits on a gone worker's queue, however recent
            stale.update(raw.decode() for raw in
                         client.lrange(rq_queue_key(keys.rq_replica_queue(w)), 0, -1))
        if not stale:
            return 0
        by_worker: dict[str, list[str]] = {}
        ids = sorted(stale)
        for aid, worker in zip(ids, map(placed_on, client.hmget(keys.attempts, ids)),
                               strict=True):
            by_worker.setdefault(worker or "", []).append(aid)
        moved = 0
        for worker, aids in by_worker.items():
            # "" (attempts no longer placed) only clears their left-over placed entries
            n = ledger.move(worker, aids)
            if n:
                log.info("worker %s: %d placed attempt(s) moved to the shared queue "
                         "(not started in time, or the worker is gone)", worker, n)
            moved += n
        return moved

    def _requeue_lost_jobs(self) -> list[str]:
        """Queued attempts whose RQ job is gone go to the outbox again, and RQ's
        intermediate list is swept of jobs whose attempt has ended (see
        :mod:`queue_rollout.ledger.jobs`)."""
        client, keys = self.ledger.client, self.ledger.keys
        requeued = requeue_lost(client, keys, self.ledger.clock() - self.config.timeouts.lease)
        for aid in requeued:
            log.warning("attempt %s: its RQ job was lost; handed to the outbox again", aid)
        sweep_intermediate(client, keys)
        return requeued
