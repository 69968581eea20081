"""The RQ side of a worker: an :class:`EpisodeWorker` runs one episode job at a time;
the supervisor (:mod:`.supervisor`) keeps ``slots_per_replica`` of them per GPU, as
processes of ``engine.threads_per_process`` worker threads each (1: one process per slot).

Each process is a plain RQ worker on the farm's queue (it shows in ``rq info``), with
RQ's JSON serializer. The job payload is the attempt id alone; the process runs it
through its :class:`~.episode.AttemptRunner`. RQ's ``SimpleWorker`` does not refresh
its heartbeats while a job runs, so a thread does it here: a long episode is never
taken for abandoned. SIGTERM: RQ's warm shutdown (no new job), and the runner's grace
period for the running episode. A worker in a thread installs no signal handlers and
times no job with SIGALRM (both are the main thread's); it polls the queue once a
second so that a stop request ends its loop, and the process's main thread turns
SIGTERM into that request for every thread.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import msgspec
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.timeouts import TimerDeathPenalty
from rq.worker import SimpleWorker, WorkerStatus

from queue_rollout.config import Config
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.keys import EPISODE_JOB_FUNC, Keys
from queue_rollout.workers.episode import CURRENT_RUNNER, AttemptRunner
from queue_rollout.workers.workflows import load_workflow

log = logging.getLogger(__name__)
SPEC_ENV = "QUEUE_ROLLOUT_WORKER_SPEC"
RQ_HEARTBEAT_S = 60.0


class EpisodeWorker(SimpleWorker):
    def __init__(self, *args: Any, runner: AttemptRunner, in_thread: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runner = runner
        self.in_thread = in_thread
        self._lock = threading.Lock()
        self._running: tuple[Job, Any] | None = None
        self._beat: threading.Thread | None = None
        if in_thread:  # SIGALRM belongs to the main thread (jobs carry no timeout anyway)
            self.death_penalty_class = TimerDeathPenalty

    def _install_signal_handlers(self) -> None:
        if not self.in_thread:
            super()._install_signal_handlers()  # type: ignore[no-untyped-call]  # rq: untyped

    def dequeue_job_and_maintain_ttl(self, timeout: int | None,
                                     max_idle_time: int | None = None) -> tuple[Job, Queue] | None:
        # after a replica failure, no job is taken until the replica is healthy again
        self.runner.await_replica(lambda: self._stop_requested, self.heartbeat)
        if not self.in_thread:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        while not self._stop_requested:  # one-second polls: a stop request ends the loop
            result = super().dequeue_job_and_maintain_ttl(1, max_idle_time=1)
            if result is not None:
                return result
        return None

    def stop_in_thread(self) -> None:
        """From the main thread: finish the running episode (within the grace), take
        no new job."""
        self.runner.request_stop()
        self._stop_requested = True

    def execute_job(self, job: Job, queue: Queue) -> None:
        problem = foreign_job(job)
        if problem:  # RQ would import and call whatever a job names: not here
            log.warning("refused job %s: %s; deleted unrun", job.id, problem)
            job.delete(remove_from_queue=True)
            return
        execution = self.prepare_execution(job)
        with self._lock:
            self._running = (job, execution)
            if self._beat is None:  # one thread for the worker's life, not one per job
                self._beat = threading.Thread(target=self._rq_heartbeat, daemon=True,
                                              name="rq-heartbeat")
                self._beat.start()
        token = CURRENT_RUNNER.set(self.runner)
        try:
            self.perform_job(job, queue, execution)
        finally:
            CURRENT_RUNNER.reset(token)
            with self._lock:
                self._running = None
        self.set_state(WorkerStatus.IDLE)

    def _rq_heartbeat(self) -> None:
        """Keep RQ's heartbeats of the running job fresh (SimpleWorker does not)."""
        while True:
            time.sleep(RQ_HEARTBEAT_S)
            with self._lock:
                running = self._running
                if running is None:
                    continue
                try:
                    self.maintain_heartbeats(*running)
                except Exception as exc:
                    log.warning("rq heartbeat failed: %s", exc)

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.runner.request_stop()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]  # rq: untyped


def foreign_job(job: Job) -> str:
    """Why *job* is not one of the farm's episode jobs ("" if it is): exactly
    ``run_attempt(attempt_id)``, no keyword arguments, no callbacks. A job is data
    anyone with write access to the queue can forge; RQ would import and call the
    function it names."""
    try:
        func, args, kwargs = job.func_name, job.args, job.kwargs
    except Exception as exc:
        return f"unreadable payload ({type(exc).__name__})"
    if func != EPISODE_JOB_FUNC:
        return f"function {func!r} is not {EPISODE_JOB_FUNC}"
    if kwargs or len(args) != 1 or not isinstance(args[0], str):
        return "arguments are not one attempt id"
    callbacks = (job._success_callback_name, job._failure_callback_name,
                 job._stopped_callback_name)
    if any(callbacks):
        return "it carries callbacks"
    return ""


class WorkerSpec(msgspec.Struct, forbid_unknown_fields=True):
    """What the supervisor hands a child process (as JSON in its environment)."""

    config: Config
    worker_id: str
    engine_url: str
    boot_id: str
    index: int
    threads: int = 1


def _episode_worker(spec: WorkerSpec, client: Any, thread: int | None) -> EpisodeWorker:
    config = spec.config
    runner = AttemptRunner(
        ledger=Ledger.from_config(client, config), config=config,
        client=SGLangClient(spec.engine_url, timeout=min(30, config.timeouts.request)),
        worker_id=spec.worker_id, boot_id=spec.boot_id, workflow=load_workflow(config))
    keys = Keys(config.farm.name)
    suffix = "" if thread is None else f"-t{thread}"
    return EpisodeWorker(
        [Queue(keys.rq_queue, connection=client, serializer=JSONSerializer)],
        connection=client, serializer=JSONSerializer, runner=runner,
        in_thread=thread is not None, name=f"{spec.worker_id}-{spec.index}-{os.getpid()}{suffix}")


def child_main() -> int:
    """Entry point of one episode process: ``python -m queue_rollout.workers.rq_worker``."""
    spec = msgspec.json.decode(os.environ[SPEC_ENV].encode(), type=WorkerSpec)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {spec.worker_id}/{spec.index} "
                               "%(levelname)s %(message)s")
    from queue_rollout.ledger.connection import resolve_url

    client = connect(resolve_url(spec.config), spec.config.farm.redis_ca_file)
    if spec.threads == 1:
        _episode_worker(spec, client, None).work(logging_level="WARNING")
        return 0
    workers = [_episode_worker(spec, client, t) for t in range(spec.threads)]

    def on_signal(signum: int, frame: object) -> None:
        for w in workers:
            w.stop_in_thread()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threads = [threading.Thread(target=w.work, kwargs={"logging_level": "WARNING"},
                                name=w.name) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():  # join in slices: the main thread must stay free for signals
            t.join(0.5)
    return 0


def spec_env(spec: WorkerSpec) -> dict[str, str]:
    return {**os.environ, SPEC_ENV: json.dumps(msgspec.to_builtins(spec))}


if __name__ == "__main__":
    sys.exit(child_main())
