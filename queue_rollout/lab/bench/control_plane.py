"""The control-plane benchmark: no-op episodes through the whole farm against no-op jobs
through plain RQ, with the same number of worker processes, side by side.

Farm: prompts of G = 8 no-op episodes (the ``noop`` workflow calls no replica) go
through admission, the outbox, RQ's queue, the ledger's start and finish, judgement and
batches of B = 16 groups (the reference shape), which the bench takes and acknowledges
(a run whose groups are not whole batches ends when its last groups are accepted);
``workers`` episode processes of one slot each
(:class:`~queue_rollout.workers.rq_worker.EpisodeProcess`) run them. Plain RQ: a
producer enqueues the same number of jobs of a function that does nothing (JSON
serializer, as the farm's), in pipelines of 100 as the farm's outbox does, and
``workers`` plain ``SimpleWorker`` processes run them. Each side is timed from its
first submission to its last episode done (the farm: the last batch delivered); the
sides alternate (plain, farm, farm, plain, ...) so that background load hits both
alike. Each side runs exactly the episodes asked for, split as evenly as whole groups
allow over its runs (:func:`side_runs`).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
from rq import Queue, SimpleWorker
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import Config
from queue_rollout.errors import BadInput, InvariantViolation
from queue_rollout.lab.bench.pilot import wait_for_rq_workers
from queue_rollout.launch.up import LocalFarm
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.jobs import episode_queue
from queue_rollout.procs import spawn, stop_all

GROUP, BATCH = 8, 16  # the reference shape: a batch is 16 groups of 8
ROUNDS = 2  # of (plain, farm, farm, plain): 4 runs a side


def noop() -> None:
    """The plain-RQ job: nothing."""


@dataclass(frozen=True)
class ControlPlaneResult:
    workers: int
    episodes: int  # per side, summed over rounds
    farm_s: float
    plain_s: float

    @property
    def farm_episodes_per_s(self) -> float:
        return self.episodes / self.farm_s

    @property
    def plain_rq_jobs_per_s(self) -> float:
        return self.episodes / self.plain_s

    @property
    def ratio(self) -> float:
        return self.farm_episodes_per_s / self.plain_rq_jobs_per_s

    def as_json(self) -> dict[str, object]:
        return {"profile": "control-plane", "workers": self.workers,
                "episodes": self.episodes,
                "worker_class": "farm: episode processes; plain: rq.SimpleWorker processes",
                "farm_episodes_per_s": round(self.farm_episodes_per_s, 1),
                "plain_rq_jobs_per_s": round(self.plain_rq_jobs_per_s, 1),
                "ratio": round(self.ratio, 3)}


def run_plain(redis_url: str, workers: int, jobs: int, tag: str) -> float:
    """Seconds for *jobs* no-op jobs through plain RQ with *workers* SimpleWorker processes."""
    client = connect(redis_url)
    queue = Queue(f"plain-{tag}", connection=client, serializer=JSONSerializer)
    procs = [spawn([sys.executable, "-P", "-m", "queue_rollout.lab.bench.control_plane",
                    redis_url, queue.name], stdout=subprocess.DEVNULL)
             for _ in range(workers)]
    try:
        wait_for_rq_workers(queue, workers)
        registry = FinishedJobRegistry(queue=queue)
        t0 = time.monotonic()
        for start in range(0, jobs, 100):  # in pipelines of 100, as the farm's outbox
            queue.enqueue_many([Queue.prepare_data(noop, job_id=uuid.uuid4().hex, timeout=-1)
                                for _ in range(start, min(jobs, start + 100))])
        while registry.count < jobs:
            time.sleep(0.005)
        return time.monotonic() - t0
    finally:
        stop_all(procs, 10)


def run_farm(redis_url: str, workers: int, episodes: int, tag: str, workdir: Path) -> float:
    """Seconds for *episodes* no-op episodes through the farm with *workers* episode
    processes (one worker of *workers* slots, one process each)."""
    state = workdir / tag
    config = msgspec.convert({
        "farm": {"name": f"cp-{tag}", "redis_url": redis_url, "state_dir": str(state)},
        "rollout": {"group_size": GROUP, "batch_size": BATCH, "max_concurrent_samples": 1024,
                    "max_staleness": 100_000},
        "workflow": {"name": "noop"},
        "engine": {"replicas": 1, "slots_per_replica": workers, "threads_per_process": 1},
        "metrics": {"port": free_port()},
        "timeouts": {"shutdown_grace": 2},
    }, Config)
    state.mkdir(parents=True, exist_ok=True)
    farm = LocalFarm(config, state / "farm.toml", log_dir=state)
    farm.start()
    stop = threading.Event()
    try:
        client = RolloutClient(Ledger.from_config(connect(redis_url), config), config)
        farm.wait_ready(stop)
        wait_for_rq_workers(episode_queue(client.ledger.client, client.ledger.keys), workers)
        if episodes % GROUP:
            raise ValueError(f"{episodes} episodes are not whole groups of {GROUP}")
        groups = episodes // GROUP
        t0 = time.monotonic()
        client.submit({"id": f"cp-{i}", "prompt": "noop"} for i in range(groups))
        for _ in range(groups // BATCH):
            client.ack(client.get_batch(timeout=600))
        # groups short of a batch: done once accepted (no batch will take them)
        deadline = time.monotonic() + 600
        while client.ledger.counters().get("accepted", 0) < groups:
            if time.monotonic() > deadline:
                raise InvariantViolation(f"bench control-plane: {groups} groups not all "
                                         "accepted within 600 s")
            time.sleep(0.005)
        elapsed = time.monotonic() - t0
        finished = client.ledger.counters().get("finished", 0)
        if finished != groups * GROUP:
            raise InvariantViolation(f"bench control-plane: {finished} episodes finished, "
                                     f"expected {groups * GROUP}")
        return elapsed
    finally:
        stop.set()
        farm.stop()


def side_runs(episodes: int, rounds: int = ROUNDS) -> list[int]:
    """The episodes of each of a side's 2 x *rounds* runs: *episodes* in all, whole
    groups of ``GROUP`` in each, the runs differing by one group at most (the first ones
    the larger). BadInput when *episodes* cannot be split so."""
    runs = 2 * rounds
    if episodes % GROUP or episodes < GROUP * runs:
        raise BadInput(f"--episodes: {episodes} is not a multiple of {GROUP} of at least "
                       f"{GROUP * runs}: each side runs groups of {GROUP} episodes, at "
                       f"least one in each of its {runs} runs")
    per_run, more = divmod(episodes // GROUP, runs)
    return [(per_run + (i < more)) * GROUP for i in range(runs)]


def run_control_plane_bench(redis_url: str, *, workers: int = 8, episodes: int = 2000,
                            rounds: int = ROUNDS,
                            progress: Callable[[str], None] = lambda line: None
                            ) -> ControlPlaneResult:
    """*rounds* rounds of (plain, farm, farm, plain), each side *episodes* in all (over
    every run, as :func:`side_runs` splits them)."""
    sizes = {"plain": side_runs(episodes, rounds), "farm": side_runs(episodes, rounds)}
    farm_s = plain_s = 0.0
    with tempfile.TemporaryDirectory(prefix="qr-bench-cp-") as tmp:
        n = 0
        for r in range(rounds):
            for side in ("plain", "farm", "farm", "plain"):
                n += 1
                size = sizes[side].pop(0)
                if side == "plain":
                    s = run_plain(redis_url, workers, size, f"{r}-{n}")
                    plain_s += s
                else:
                    s = run_farm(redis_url, workers, size, f"{r}-{n}", Path(tmp))
                    farm_s += s
                progress(f"control-plane round {r + 1}: {side} {size} episodes in {s:.2f}s "
                         f"({size / s:.0f}/s)")
    return ControlPlaneResult(workers, episodes, farm_s, plain_s)


def _plain_worker(redis_url: str, queue_name: str) -> None:
    client = connect(redis_url)
    queue = Queue(queue_name, connection=client, serializer=JSONSerializer)
    SimpleWorker([queue], connection=client, serializer=JSONSerializer).work(
        logging_level="WARNING")


if __name__ == "__main__":
    _plain_worker(sys.argv[1], sys.argv[2])
