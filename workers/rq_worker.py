"""The RQ side of a worker: one :class:`EpisodeWorker` process runs one episode job at
a time; the supervisor (:mod:`.supervisor`) keeps ``slots_per_replica`` of them per GPU.

Each process is a plain RQ worker on the farm's queue (it shows in ``rq info``), with
RQ's JSON serializer. The job payload is the attempt id alone; the process runs it
through its :class:`~.episode.AttemptRunner`. RQ's ``SimpleWorker`` does not refresh
its heartbeats while a job runs, so a thread does it here: a long episode is never
taken for abandoned. SIGTERM: RQ's warm shutdown (no new job), and the runner's grace
period for the running episode.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any

import msgspec
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker, WorkerStatus

from queue_rollout.config import Config
from queue_rollout.keys import Keys
from queue_rollout.ledger import Ledger
from queue_rollout.redis_conn import connect

from .episode import CURRENT_RUNNER, AttemptRunner
from .sglang_client import SGLangClient
from .workflows import load_workflow

log = logging.getLogger(__name__)
SPEC_ENV = "QUEUE_ROLLOUT_WORKER_SPEC"
RQ_HEARTBEAT_S = 60.0


class EpisodeWorker(SimpleWorker):
    def __init__(self, *args: Any, runner: AttemptRunner, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runner = runner

    def execute_job(self, job: Job, queue: Queue) -> None:
        execution = self.prepare_execution(job)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(RQ_HEARTBEAT_S):
                try:
                    self.maintain_heartbeats(job, execution)
                except Exception as exc:  # noqa: BLE001 - a missed beat is retried
                    log.warning("rq heartbeat failed: %s", exc)

        thread = threading.Thread(target=beat, daemon=True, name="rq-heartbeat")
        thread.start()
        token = CURRENT_RUNNER.set(self.runner)
        try:
            self.perform_job(job, queue, execution)
        finally:
            CURRENT_RUNNER.reset(token)
            stop.set()
            thread.join()
        self.set_state(WorkerStatus.IDLE)

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.runner.request_stop()
        super().request_stop(signum, frame)


class WorkerSpec(msgspec.Struct, forbid_unknown_fields=True):
    """What the supervisor hands a child process (as JSON in its environment)."""

    config: Config
    worker_id: str
    engine_url: str
    boot_id: str
    index: int


def child_main() -> int:
    """Entry point of one episode process: ``python -m queue_rollout.workers.rq_worker``."""
    spec = msgspec.json.decode(os.environ[SPEC_ENV].encode(), type=WorkerSpec)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {spec.worker_id}/{spec.index} %(levelname)s %(message)s")
    config = spec.config
    from queue_rollout.redis_conn import resolve_url

    client = connect(resolve_url(config), config.farm.redis_ca_file)
    ledger = Ledger.from_config(client, config)
    runner = AttemptRunner(
        ledger=ledger, config=config,
        client=SGLangClient(spec.engine_url, timeout=min(30, config.timeouts.request)),
        worker_id=spec.worker_id, boot_id=spec.boot_id, workflow=load_workflow(config))
    keys = Keys(config.farm.name)
    worker = EpisodeWorker(
        [Queue(keys.rq_queue, connection=client, serializer=JSONSerializer)],
        connection=client, serializer=JSONSerializer, runner=runner,
        name=f"{spec.worker_id}-{spec.index}-{os.getpid()}")
    worker.work(logging_level="WARNING")
    return 0


def spec_env(spec: WorkerSpec) -> dict[str, str]:
    return {**os.environ, SPEC_ENV: json.dumps(msgspec.to_builtins(spec))}


if __name__ == "__main__":
    sys.exit(child_main())
