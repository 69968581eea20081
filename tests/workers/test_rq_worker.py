"""The episode process against RQ's own internals (rq is pinned to the minor version
these overrides were written for): its slots are RQ workers that RQ's tools list, its
records are refreshed and removed by RQ's own methods, and jobs go through RQ's queue
and intermediate list by their ids alone."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

from rq import Queue, Worker
from rq.serializers import JSONSerializer

from queue_rollout.config import load_config
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.jobs import flush_outbox
from queue_rollout.ledger.keys import Keys
from queue_rollout.workers.rq_worker import EpisodeProcess, WorkerSpec
from testkit import G2_B1, wait_for, write_farm


def farm_toml(path: Path, redis_url: str, threads: int) -> Path:
    return write_farm(path, farm={"name": "rqw", "redis_url": redis_url}, rollout=G2_B1,
                      engine={"slots_per_replica": 2, "threads_per_process": threads},
                      timeouts={"shutdown_grace": 2, "lease": 3})


def test_rq_lists_every_slot_as_a_worker_of_the_farm_queue(tmp_path, redis_url, r):
    rq = shutil.which("rq", path=str(Path(sys.executable).parent))
    assert rq is not None
    toml = farm_toml(tmp_path / "farm.toml", redis_url, threads=2)
    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    with ThreadedSimEngine(slots=2, step_ms=0.5) as engine:
        proc = subprocess.Popen([exe, "worker", "--gpu", "0", "--engine-url", engine.url,
                                 "-c", str(toml)], stdout=subprocess.PIPE, text=True)
        try:
            assert "2 episode slots in 1 process on " in proc.stdout.readline()
            workers = wait_for(lambda: (w := Worker.all(connection=r,
                                                        serializer=JSONSerializer))
                               and len(w) == 2 and w, what="2 RQ workers")
            queue = Keys("rqw").rq_queue
            assert all(w.queue_names() == [queue] for w in workers)
            info = subprocess.run([rq, "info", "-u", redis_url, "-S", "json", "--only-workers"],
                                  capture_output=True, text=True, timeout=60)
            assert info.returncode == 0, info.stderr
            assert all(w.name in info.stdout for w in workers)
            assert "2 workers" in info.stdout
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
    assert Worker.all(connection=r, serializer=JSONSerializer) == []  # RQ's register_death


def test_rq_records_are_refreshed_and_jobs_leave_the_intermediate_list(tmp_path, redis_url,
                                                                       r):
    config = load_config(farm_toml(tmp_path / "farm.toml", redis_url, threads=1))
    with ThreadedSimEngine(slots=2, step_ms=0.5) as engine:
        process = EpisodeProcess(
            WorkerSpec(config=config, worker_id="w-gpu0", engine_url=engine.url,
                       boot_id="b", index=0),
            connect(redis_url, max_connections=4), connect(redis_url, max_connections=1))
        [rq_worker] = process.rq_workers
        rq_worker.register_birth()
        r.expire(rq_worker.key, 5)
        process._rq_heartbeat()  # RQ's own heartbeat: worker_ttl + 60 s from now
        assert r.ttl(rq_worker.key) > 400
        ledger = Ledger.from_config(r, config)
        ledger.submit([("p", b'{"id": "p", "prompt": "x", "member_lengths": [5, 5]}')])
        first, second = ledger.admit().attempt_ids
        flush_outbox(r, ledger.keys)
        queue = Queue(ledger.keys.rq_queue, connection=r, serializer=JSONSerializer)
        taken = process._take()  # RQ's queue -> RQ's intermediate list
        assert taken == first and queue.job_ids == [second]
        assert [x.decode() for x in r.lrange(queue.intermediate_queue_key, 0, -1)] == [first]
        process.done.put(first)  # its attempt ended: cleared with the next dequeue
        assert process._take() == second
        assert [x.decode() for x in r.lrange(queue.intermediate_queue_key, 0, -1)] == [second]
        rq_worker.register_death()
