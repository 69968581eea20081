"""One episode process: ``engine.threads_per_process`` episode slots, as threads, fed
from the farm's RQ queue by one dequeue loop.

The supervisor (:mod:`.supervisor`) keeps ``slots_per_replica`` slots per GPU in
processes of ``threads_per_process`` threads. What one process costs Redis is kept
small on purpose, because a thousand GPUs share one Redis:

- **One dequeue loop** (the main thread) takes a job only when a slot is free: a
  ``BLMOVE`` from RQ's queue to its intermediate list, waiting up to
  ``DEQUEUE_TIMEOUT_S``, so an idle process makes one call every few seconds (and a
  stop request is seen within that time).
- **Placement** (``rollout.placement = "group"``): the collector places a group's
  attempts on one replica's queue, and the loop waits on that queue. A process with a
  free slot also looks at the shared queue (attempts moved there), without waiting, at
  most every ``SHARED_CHECK_S`` and after every wait that found nothing: one call more
  a second at most, and a moved job waits at most ``DEQUEUE_TIMEOUT_S`` for a process
  with a free slot.
- **The job is its id**: the job id is the attempt id, and the process runs that
  attempt (the ledger's ``start`` refuses an id it does not know). It never imports or
  calls what a job's payload names, so a job forged by anyone who can write the queue
  runs nothing: it is deleted unrun. A job is its id alone: no job record, status,
  result, registry or worker statistic is written (see the docs for what RQ's tools
  then show). When the attempt has ended, the id leaves RQ's intermediate list in the
  same round trip as the next dequeue.
- **Leases** of all the process's running attempts are renewed together, every
  lease / 3, in one ledger call (:class:`~.episode.LeaseKeeper`).
- **RQ's worker records**: each slot is registered as an RQ worker (so ``rq info``
  lists them), and all of the process's records are refreshed in one pipeline every
  ``RQ_HEARTBEAT_S``, well within RQ's ``worker_ttl``. RQ's per-worker command channel
  is not listened to: ``rq shutdown``, ``rq suspend`` (per worker) and RQ's
  kill-horse / stop-job commands do nothing here; stop a worker with SIGTERM to its
  supervisor.
- **Adaptive concurrency** (``engine.adaptive_slots``): a job is taken only while the
  process's running episodes are under its share of the worker's limit, which the
  supervisor sets (:mod:`.limits`, a local file, no Redis call); a lower limit stops
  no running episode. A dequeue already waiting when the limit drops still takes the
  job it gets.
- **Connections**: one for the dequeue loop, and a pool of at most
  ``POOL_CONNECTIONS`` for every other call of the process's threads.

SIGTERM: no new job; running episodes may finish within ``timeouts.shutdown_grace``,
then they are aborted and handed back (see :mod:`.episode`).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable

import msgspec
import redis
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from queue_rollout.config import Config
from queue_rollout.engines.client import engine_client
from queue_rollout.errors import QueueRolloutError
from queue_rollout.ledger.clock import wall_clock
from queue_rollout.ledger.connection import client_url, connect_config, translate_errors
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.jobs import WorkerQueues, episode_queue
from queue_rollout.ledger.keys import Keys
from queue_rollout.workers.episode import CURRENT_RUNNER, AttemptRunner, LeaseKeeper
from queue_rollout.workers.limits import GATE_READ_S, SlotGate
from queue_rollout.workers.workflows import load_workflow

log = logging.getLogger(__name__)
SPEC_ENV = "QUEUE_ROLLOUT_WORKER_SPEC"
DEQUEUE_TIMEOUT_S = 5  # an idle process's one call; a stop request is seen within it
RQ_HEARTBEAT_S = 120.0  # RQ's worker records live worker_ttl + 60 = 480 s
POOL_CONNECTIONS = 4  # ledger calls are short: a few connections serve every thread
#: Placement: a process with a free slot looks at the shared queue (moved attempts) at
#: least this often, so its own queue's jobs never starve those.
SHARED_CHECK_S = 1.0
_ATTEMPT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class _StopDequeue(Exception):
    """Raised by the signal handler into a dequeue that is waiting (as RQ does)."""


class WorkerSpec(msgspec.Struct, forbid_unknown_fields=True):
    """What the supervisor hands a child process (as JSON in its environment)."""

    config: Config
    worker_id: str
    engine_url: str
    boot_id: str
    index: int
    threads: int = 1
    first_slot: int = 0  # the worker's slot number of this process's first slot
    limit_file: str = ""  # adaptive concurrency: where the supervisor writes the limit
    clock_offset: float = 0.0  # seconds the supervisor's wall clock is off (tests)


class EpisodeProcess:
    """The dequeue loop, the slot threads and RQ's records of one episode process."""

    def __init__(self, spec: WorkerSpec, client: redis.Redis, blocking: redis.Redis) -> None:
        config: Config = spec.config
        self.config, self.client, self.blocking = config, client, blocking
        self.keys = Keys(config.farm.name)
        ledger = Ledger.from_config(client, config, clock=wall_clock(spec.clock_offset))
        engine = engine_client(config.engine.kind, spec.engine_url,
                               timeout=min(30, config.timeouts.request))
        workflow = load_workflow(config)
        self.lease = LeaseKeeper(ledger, engine, spec.worker_id, config.timeouts.lease)
        self.runners = [AttemptRunner(ledger=ledger, config=config, client=engine,
                                      worker_id=spec.worker_id, boot_id=spec.boot_id,
                                      workflow=workflow, lease=self.lease)
                        for _ in range(spec.threads)]
        rq_queue = episode_queue(client, self.keys)
        #: placement: the replica's own queue is read first
        self.queues = WorkerQueues.of(self.keys, spec.worker_id,
                                      placing=config.rollout.placement == "group")
        self._shared_check_at = 0.0  # placement: when to look at the shared queue next
        suffix = "" if spec.threads == 1 else "-t{}"
        self.rq_workers = [
            SimpleWorker([rq_queue], connection=client, serializer=JSONSerializer,
                         name=f"{spec.worker_id}-{spec.index}-{os.getpid()}"
                              + suffix.format(t))
            for t in range(spec.threads)]
        self.jobs: queue.Queue[str | None] = queue.Queue()
        self.done: queue.SimpleQueue[str] = queue.SimpleQueue()  # jobs to clear
        self.free = threading.Semaphore(spec.threads)  # slots without a job
        self.gate = SlotGate(spec.limit_file, spec.first_slot, spec.threads)
        self.busy = 0  # slots with a job (for the gate)
        self._busy_lock = threading.Lock()
        self.stopping = threading.Event()
        self._dequeuing = False  # the main thread waits in BLMOVE
        self._next_beat = 0.0  # when RQ's worker records are refreshed next
        self._url = client_url(client)

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        with translate_errors(self._url):
            for w in self.rq_workers:
                w.register_birth()  # type: ignore[no-untyped-call]  # rq: untyped
        threads = [threading.Thread(target=self._slot, args=(runner,), name=f"slot-{i}")
                   for i, runner in enumerate(self.runners)]
        for t in threads:
            t.start()
        try:
            self._dequeue_loop()
        finally:
            for _ in threads:
                self.jobs.put(None)
            for t in threads:
                while t.is_alive():  # join in slices: the main thread stays free for signals
                    t.join(0.5)
            self._clear_done()
            self._deregister()
        return 0

    def request_stop(self) -> None:
        """No new job; running episodes finish within the shutdown grace. Called from
        the signal handler: a dequeue waiting at that moment is ended at once."""
        self.stopping.set()
        for runner in self.runners:
            runner.request_stop()
        if self._dequeuing:
            self._dequeuing = False
            raise _StopDequeue

    def _dequeue_loop(self) -> None:
        self._next_beat = time.monotonic() + RQ_HEARTBEAT_S
        while not self.stopping.is_set():
            self._beat_when_due()
            if not self.free.acquire(timeout=1.0):  # every slot busy: wait, no Redis call
                continue
            if self.busy >= self.gate.share():  # under a lower limit: wait, no Redis call
                self.free.release()
                self.stopping.wait(GATE_READ_S)
                continue
            aid = None
            while aid is None and not self.stopping.is_set():
                self._beat_when_due()
                self._await_replica()
                aid = self._take()
            if aid is None:
                self.free.release()
                return
            if self.stopping.is_set():  # taken just as the stop came: back to the front
                self._give_back(aid)
                self.free.release()
                return
            with self._busy_lock:
                self.busy += 1
            self.jobs.put(aid)

    def _take(self) -> str | None:
        """Clear the jobs whose attempts ended and dequeue the next one: one round trip
        (a placing farm's process also looks at the shared queue, without waiting, at
        most every ``SHARED_CHECK_S`` and after each wait that found nothing)."""
        cleared: list[str] = []
        if self.queues.own is not None and time.monotonic() >= self._shared_check_at:
            self._shared_check_at = time.monotonic() + SHARED_CHECK_S
            pipe = self.client.pipeline(transaction=False)
            cleared = self._ended()
            self.queues.take(pipe, cleared, wait_s=None, shared=True)
            try:
                with translate_errors(self._url):
                    raw = pipe.execute()[-1]
            except QueueRolloutError as exc:
                self._dequeue_failed(exc, cleared)
                return None
            if raw is not None:
                return str(raw.decode())
        pipe = self.blocking.pipeline(transaction=False)
        ended = self._ended()
        cleared += ended
        self.queues.take(pipe, ended, wait_s=DEQUEUE_TIMEOUT_S)
        try:
            with translate_errors(self._url):
                self._dequeuing = not self.stopping.is_set()
                try:
                    raw = pipe.execute()[-1]
                finally:
                    self._dequeuing = False
        except _StopDequeue:
            # the reply was not read: drop the connection (a job the server moved just
            # then waits in the intermediate list until the reconciler hands it back)
            self.blocking.connection_pool.disconnect()
            for aid in cleared:
                self.done.put(aid)
            return None
        except QueueRolloutError as exc:
            self._dequeue_failed(exc, cleared)
            return None
        if raw is None:
            self._shared_check_at = 0.0  # nothing of its own: the shared queue next
            return None
        return str(raw.decode())

    def _dequeue_failed(self, exc: QueueRolloutError, cleared: list[str]) -> None:
        for aid in cleared:  # perhaps not cleared: again next time (it is idempotent)
            self.done.put(aid)
        log.warning("dequeue: %s; retrying", exc)
        time.sleep(1.0)

    def _ended(self) -> list[str]:
        """The jobs whose attempts have ended, to clear with the next take."""
        ended: list[str] = []
        while True:
            try:
                ended.append(self.done.get_nowait())
            except queue.Empty:
                return ended

    def _clear_done(self) -> None:
        ended = self._ended()
        self._best_effort("could not clear finished jobs (the reconciler will)",
                          lambda: self.queues.clear(self.client, ended))

    def _await_replica(self) -> None:
        """After a replica failure, no job is taken until the replica answers (a dead
        replica costs each slot one attempt, not one per queued job)."""
        failed = [r for r in self.runners if r.replica_failed]
        if not failed:
            return
        failed[0].await_replica(self.stopping.is_set, lambda: None)
        for r in self.runners:
            r.replica_failed = False

    def _slot(self, runner: AttemptRunner) -> None:
        CURRENT_RUNNER.set(runner)
        while (aid := self.jobs.get()) is not None:
            try:
                self._run(runner, aid)
            except Exception:
                log.exception("attempt %s: the slot failed", aid)
            finally:
                self.done.put(aid)  # cleared with the next dequeue
                with self._busy_lock:
                    self.busy -= 1
                self.free.release()

    def _run(self, runner: AttemptRunner, aid: str) -> None:
        if not _ATTEMPT_ID.fullmatch(aid):
            log.warning("job %r is not an attempt id: deleted unrun", aid[:200])
            return
        if runner.run(aid) == "unknown":
            log.warning("job %s names no attempt of farm %s: deleted unrun", aid,
                        self.config.farm.name)
            # a job someone enqueued with RQ's own tools has a record: gone too
            self._best_effort(f"job {aid}: could not delete its record",
                              lambda: self.client.delete(f"rq:job:{aid}"))

    # -- RQ's records ------------------------------------------------------------------

    def _give_back(self, aid: str) -> None:
        self._best_effort(f"job {aid}: could not give it back (the reconciler will)",
                          lambda: self.queues.give_back(self.client, aid))

    def _beat_when_due(self) -> None:
        """RQ's worker records, refreshed every ``RQ_HEARTBEAT_S``."""
        if time.monotonic() >= self._next_beat:
            self._rq_heartbeat()
            self._next_beat = time.monotonic() + RQ_HEARTBEAT_S

    def _rq_heartbeat(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        for w in self.rq_workers:
            w.heartbeat(pipeline=pipe)
        self._best_effort("rq heartbeat failed", pipe.execute)

    def _deregister(self) -> None:
        def register_deaths() -> None:
            for w in self.rq_workers:
                w.register_death()  # type: ignore[no-untyped-call]  # rq: untyped

        self._best_effort("could not deregister from RQ", register_deaths)

    def _best_effort(self, what: str, call: Callable[[], object]) -> None:
        """Run *call* against Redis; a failure is logged (``what: error``), not raised:
        what it does is mended later (the reconciler, the next heartbeat)."""
        try:
            with translate_errors(self._url):
                call()
        except QueueRolloutError as exc:
            log.warning("%s: %s", what, exc)


def child_main() -> int:
    """Entry point of one episode process: ``python -m queue_rollout.workers.rq_worker``."""
    spec = msgspec.json.decode(os.environ[SPEC_ENV].encode(), type=WorkerSpec)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {spec.worker_id}/{spec.index} "
                               "%(levelname)s %(message)s")
    process = EpisodeProcess(spec, connect_config(spec.config, max_connections=POOL_CONNECTIONS),
                             connect_config(spec.config, max_connections=1,
                                            socket_timeout=DEQUEUE_TIMEOUT_S + 10))
    def on_signal(signum: int, frame: object) -> None:
        process.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return process.run()


def spec_env(spec: WorkerSpec) -> dict[str, str]:
    return {**os.environ, SPEC_ENV: json.dumps(msgspec.to_builtins(spec))}


if __name__ == "__main__":
    sys.exit(child_main())
