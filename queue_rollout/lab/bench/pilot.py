"""The pilot benchmarks: both admission modes over one prompt manifest, through the
real stack (Redis, collector, RQ workers, simulated replicas), audited, beside the
ideal schedule of the same policy.

One bench invocation starts one embedded Redis and ``replicas`` simulated replicas,
each logging its requests; every run (a profile in a mode) gets its own farm name,
workers and collector on them. The trainer (:mod:`queue_rollout.lab.trainer`) takes each
batch, pauses the farm (barrier), trains for ``train_s``, acknowledges, raises the policy
version and resumes; after ``train_batches`` batches the rest is drained: each batch
acknowledged and the version raised without a pause, exactly as
:class:`~queue_rollout.lab.virtual.farm.SimFarm` (the ideal schedule) does.

Active episodes come from the replicas' own request logs (start and end of every
request, on the machine's monotonic clock, which the bench shares), integrated over
generation time: the trainer's pause windows are left out.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rq import Queue, Worker

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import Config, PauseMode
from queue_rollout.errors import InvariantViolation
from queue_rollout.lab.bench.audit import audit
from queue_rollout.lab.bench.measures import ModeRun, RunningSampler
from queue_rollout.lab.bench.results import pilot_json
from queue_rollout.lab.order import completion_order
from queue_rollout.lab.redis_info import Window, read
from queue_rollout.lab.trainer import TakenBatch, run_trainer
from queue_rollout.lab.virtual.farm import SimReport
from queue_rollout.lab.virtual.ideal import (
    adaptive_interval_s,
    ideal_schedule,
    kv_settings,
    rollout_settings,
)
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.launch.up import LocalFarm, start_sim_engines
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.jobs import episode_queue
from queue_rollout.procs import Supervised, stop_all, tree_cpu_seconds
from queue_rollout.progress import LiveView


def farm_cpu_seconds(farm: LocalFarm) -> float:
    """CPU seconds a farm's processes (and their descendants) have spent so far."""
    return sum(tree_cpu_seconds(c.proc.pid) for c in farm.children() if c.proc is not None)


def wait_for_rq_workers(queue: Queue, count: int, timeout: float = 120.0) -> None:
    """Until *count* RQ workers listen on *queue*: work submitted before would wait for
    processes still starting, which is no cost of the farm's (or of RQ's)."""
    deadline = time.monotonic() + timeout
    while Worker.count(queue=queue) < count:
        if time.monotonic() > deadline:
            raise InvariantViolation(f"bench: fewer than {count} RQ workers after {timeout:g}s")
        time.sleep(0.1)


@dataclass
class Bench:
    """One Redis and one set of simulated replicas for every run of an invocation."""

    redis_url: str
    shape: Shape
    scale: Scale
    workdir: Path
    progress: Callable[[str], None] = lambda line: None
    logs: bool = True  # the processes' logs in files under workdir (else on stderr)
    engines: list[Supervised] = field(default_factory=list)
    engine_urls: list[str] = field(default_factory=list)
    runs: int = 0
    predict: bool = True  # each run's ideal schedule beside it

    def engine_section(self) -> dict[str, object]:
        s, f = self.shape, self.scale.step_factor
        return {"kind": "sim", "replicas": s.replicas, "slots_per_replica": s.slots_per_replica,
                "threads_per_process": s.slots_per_replica, "step_ms": s.step_ms * f,
                "step_ms_per_request": s.step_ms_per_request * f,
                **self.kv_settings()}

    def kv_settings(self) -> dict[str, Any]:
        return kv_settings(self.shape, self.scale)

    def start(self) -> None:
        config = msgspec.convert({"engine": self.engine_section()}, Config)
        (self.workdir / "requests").mkdir(parents=True, exist_ok=True)
        path = self.workdir / "engines.toml"
        path.write_text("")  # the engines take their timing from the command line
        self.engines, self.engine_urls = start_sim_engines(
            config, path, self.workdir / "requests",
            log_dir=self.workdir if self.logs else None)

    def stop(self) -> None:
        stop_all((e.proc for e in self.engines if e.proc), 10)

    def adaptive_section(self) -> dict[str, object]:
        """Adaptive concurrency's ``[engine]`` keys: the floor, and the look at each
        replica's metrics every second scaled by time."""
        return {"adaptive_slots": True,
                "min_slots_per_replica": self.shape.min_slots_per_replica,
                "adaptive_interval_s": adaptive_interval_s(self.scale)}

    # -- one mode ----------------------------------------------------------------------

    def run_mode(self, profile: Profile, mode: str, prompts: list[dict[str, Any]],
                 max_staleness: int, placement: str = "any", adaptive: bool = False,
                 pause_mode: PauseMode | None = None, weights: Path | None = None
                 ) -> ModeRun:
        """One run of *mode* over *prompts* on its own farm. *pause_mode*: the
        replicas' (default: the engine section's); *weights*: the trainer keeps AReaL's
        order, each replica loading this folder at every version step."""
        self.runs += 1
        s, train_s = self.shape, self.shape.train_s * self.scale.time
        state = self.workdir / f"run-{self.runs}"
        workflow = "controlled_turns" if profile.turns else "controlled_length"
        config = msgspec.convert({
            "farm": {"name": f"bench-{self.runs}-{profile.name}-{mode}",
                     "redis_url": self.redis_url, "state_dir": str(state)},
            "rollout": rollout_settings(s, mode, max_staleness, placement, adaptive),
            "workflow": {"name": workflow},
            "engine": {**self.engine_section(), **(self.adaptive_section() if adaptive else {}),
                       **({"pause_mode": pause_mode} if pause_mode else {})},
            "collector": {"step_ms": self.scale.collector_step_ms},
            "metrics": {"port": free_port()},
            "timeouts": {"shutdown_grace": 2, "pause_barrier": 30},
        }, Config)
        state.mkdir(parents=True, exist_ok=True)
        farm = LocalFarm(config, state / "farm.toml", engine_urls=self.engine_urls,
                         log_dir=state if self.logs else None)
        farm.start()
        stop = threading.Event()
        run = ModeRun(mode, s.slots, placement, adaptive, batch_size=s.batch_size,
                      farm=config.farm.name)
        try:
            redis_client = connect(self.redis_url)  # the bench's own reads of Redis
            client = RolloutClient(Ledger.from_config(redis_client, config), config)
            farm.wait_ready(stop)
            wait_for_rq_workers(episode_queue(redis_client, client.ledger.keys), s.slots)
            batches = s.stop_after or -(-len(prompts) // s.batch_size)
            redis_before = read(redis_client)
            cpu_before = farm_cpu_seconds(farm)
            t0 = run.started_at = time.monotonic()
            client.submit(prompts)
            sampler = RunningSampler(client.ledger, t0, max(0.01, self.scale.time / 2))
            view = LiveView(f"{profile.name} {mode}", batches, "batches")

            def ready(taken: TakenBatch) -> None:
                run.ready.append(taken.ready)
                run.accepted_at_ready.append(client.ledger.counters().get("accepted", 0))
                at = time.time()
                for g in taken.batch.groups:
                    run.delivered_at[g.id] = at
                    run.delivered[g.id] = [len(m.output_ids) for m in g.members]
                    run.delivered_turns[g.id] = [m.turn_lengths for m in g.members]
                    run.delivered_prompts.append(g.prompt)

            def done(taken: TakenBatch) -> None:
                if taken.pause is not None:
                    run.pauses.append(taken.pause)
                self.progress(f"{profile.name} {mode}: batch {taken.index + 1}/{batches} "
                              f"ready at {taken.ready:.2f}s")
                view.show(taken.index + 1, ready=f"{taken.ready:.1f}s")

            run_trainer(client, t0, batches=batches, train_batches=s.train_batches,
                        train_s=train_s, timeout=1800, max_poll_s=self.scale.trainer_poll_s,
                        weights=None if weights is None else str(weights),
                        on_ready=ready, on_done=done)
            view.close()
            run.cpu_s = farm_cpu_seconds(farm) - cpu_before
            run.redis = Window.between(redis_before, read(redis_client))
            run.in_flight = sampler.stop()
            run.counters = client.ledger.counters()
            run.requests = self._requests(t0, t0 + run.all_work_s + 1.0)
        finally:
            stop.set()
            farm.stop()
        # examined with the farm stopped: rolling consumption ends with work in flight,
        # and the doctor reads what no process changes meanwhile
        run.doctor_problems = examine(redis_client, client.ledger.keys,
                                      s.batch_size).problems
        if self.predict:
            run.ideal = self.ideal(prompts, mode, max_staleness, f"ideal-{self.runs}",
                                   placement=placement, adaptive=adaptive)
        return run

    def _requests(self, t0: float, t1: float) -> list[dict[str, Any]]:
        """The replicas' log entries of requests that arrived in [t0, t1], times made
        relative to t0."""
        time.sleep(0.2)  # a replica writes its log on its next tick
        out = []
        for path in sorted((self.workdir / "requests").glob("replica-*.jsonl")):
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if t0 <= entry["arrived"] <= t1:
                    out.append({**entry, "replica": path.stem,
                                **{k: entry[k] - t0 for k in ("arrived", "started", "ended")}})
        return out

    def ideal(self, prompts: list[dict[str, Any]], mode: str, max_staleness: int,
              farm: str, pause_mode: PauseMode = "in_place", placement: str = "any",
              adaptive: bool = False) -> SimReport:
        """The ideal schedule of the same policy (:func:`ideal_schedule`) on this
        bench's Redis. *farm* names it; a suffix of its own keeps it apart from every
        other run on this Redis."""
        client = connect(self.redis_url)
        try:
            return ideal_schedule(client, self.shape, self.scale, prompts, mode,
                                  max_staleness, f"{farm}-{uuid.uuid4().hex[:12]}",
                                  pause_mode=pause_mode, placement=placement,
                                  adaptive=adaptive)
        finally:
            client.close()


def run_pilot(bench: Bench, profile: Profile, max_staleness: int, placement: str = "any"
              ) -> tuple[dict[str, object], dict[str, ModeRun]]:
    """Group admission, then sample refill, over one manifest, both placing as
    *placement* says; audited. Raises :class:`InvariantViolation` listing every problem
    the audit found."""
    prompts = profile.manifest(bench.shape, bench.scale)
    runs = {mode: bench.run_mode(profile, mode, prompts, max_staleness, placement)
            for mode in ("group", "sample")}
    problems = audit(prompts, list(runs.values()), complete=bench.shape.stop_after is None)
    if problems:
        raise InvariantViolation(f"bench {profile.name}: audit failed: " + "; ".join(problems[:10]))
    result = pilot_json(profile, bench.shape, bench.scale, max_staleness,
                        runs["group"], runs["sample"])
    result["placement"] = placement
    if all("member_lengths" in p for p in prompts):
        trained = bench.shape.train_batches * bench.shape.batch_size
        lengths = {p["id"]: p["member_lengths"] for p in prompts}
        result["completion_order"] = {
            mode: completion_order(lengths, [p["id"] for p in prompts], list(run.delivered),
                                   trained) for mode, run in runs.items()}
    return result, runs


def run_audited(bench: Bench, profile: Profile, max_staleness: int,
                variants: dict[str, dict[str, Any]]) -> dict[str, ModeRun]:
    """Each variant (a name and :meth:`Bench.run_mode`'s ``mode`` and keyword arguments)
    over one manifest, in order; audited. Raises :class:`InvariantViolation` listing
    every problem the audit found."""
    prompts = profile.manifest(bench.shape, bench.scale)
    runs = {name: bench.run_mode(profile, kw["mode"], prompts, max_staleness,
                                 **{k: v for k, v in kw.items() if k != "mode"})
            for name, kw in variants.items()}
    problems = audit(prompts, list(runs.values()))
    if problems:
        raise InvariantViolation(f"bench {profile.name}: audit failed: " + "; ".join(problems[:10]))
    return runs


def open_bench(workdir: Path | None, shape: Shape, scale: Scale, redis_url: str,
               progress: Callable[[str], None], *, logs: bool = True) -> Bench:
    """A started :class:`Bench`; call ``stop()`` when done. With *logs*, the farms'
    processes log to files in *workdir*, else to this process's stderr."""
    path = Path(workdir or tempfile.mkdtemp(prefix="qr-bench-"))
    bench = Bench(redis_url, shape, scale, path, progress, logs=logs)
    bench.start()
    return bench


def window_sweep(bench: Bench, profile: Profile, windows: tuple[int, ...] = (0, 1, 2, 4, 8)
                 ) -> list[dict[str, object]]:
    """The ideal schedule of both modes at each staleness window (virtual time: cheap)."""
    prompts = profile.manifest(bench.shape, bench.scale)
    out: list[dict[str, object]] = []
    for window in windows:
        row: dict[str, object] = {"max_staleness": window}
        for mode in ("group", "sample"):
            bench.runs += 1
            report = bench.ideal(prompts, mode, window, f"sweep-{bench.runs}")
            row[mode] = {"all_work_completion_s": round(report.all_work_s, 3),
                         "mean_rollout_interval_s": round(report.mean_rollout_interval, 3),
                         "slot_occupancy": round(report.slot_occupancy, 4)}
        out.append(row)
    return out
