"""The pilot benchmarks: both admission modes over one prompt manifest, through the
real stack (Redis, collector, RQ workers, simulated replicas), audited, beside the
ideal schedule of the same policy.

One bench invocation starts one embedded Redis and ``replicas`` simulated replicas,
each logging its requests; every run (a profile in a mode) gets its own farm name,
workers and collector on them. The trainer takes each batch, pauses the farm (barrier),
trains for ``train_s``, acknowledges, raises the policy version and resumes; after
``train_batches`` batches the rest is drained: each batch acknowledged and the version
raised without a pause, exactly as :class:`~queue_rollout.virtual.farm.SimFarm` (the ideal
schedule) does.

Active episodes come from the replicas' own request logs (start and end of every
request, on the machine's monotonic clock, which the bench shares), integrated over
generation time: the trainer's pause windows are left out.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rq import Queue, Worker

from queue_rollout.bench.profiles import Profile, Scale, Shape, manifest_digest
from queue_rollout.client.rollout import RolloutClient, stand_in_training
from queue_rollout.config import Config, RolloutConfig
from queue_rollout.engines.sim_model import PauseMode
from queue_rollout.engines.sim_server import text_tokens
from queue_rollout.errors import InvariantViolation
from queue_rollout.launch.up import LocalFarm, start_sim_engines
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.outbox import episode_queue
from queue_rollout.procs import Supervised, stop_all
from queue_rollout.progress import LiveView
from queue_rollout.virtual.clock import ManualClock
from queue_rollout.virtual.farm import SimFarm, SimReport


@dataclass
class ModeRun:
    """What one mode's run measured; times in seconds since the prompts were submitted."""

    mode: str
    slots: int
    ready: list[float] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)  # trainer's windows
    accepted_at_ready: list[int] = field(default_factory=list)
    delivered: dict[str, list[int]] = field(default_factory=dict)  # group -> member tokens
    delivered_prompts: list[dict[str, Any]] = field(default_factory=list)  # as the trainer got them
    requests: list[dict[str, Any]] = field(default_factory=list)  # the replicas' log entries
    counters: dict[str, int] = field(default_factory=dict)
    doctor_problems: list[str] = field(default_factory=list)
    ideal: SimReport | None = None

    @property
    def delivered_digest(self) -> str:
        return manifest_digest(self.delivered_prompts)

    @property
    def rollout_intervals(self) -> list[float]:
        """Batch k (k = 2 .. train_batches): from the end of batch k-1's pause to k ready."""
        return [self.ready[k] - self.pauses[k - 1][1]
                for k in range(1, min(len(self.ready), len(self.pauses) + 1))]

    @property
    def mean_rollout_interval(self) -> float:
        iv = self.rollout_intervals
        return sum(iv) / len(iv) if iv else float("nan")

    @property
    def all_work_s(self) -> float:
        return self.ready[-1] if self.ready else float("nan")

    def active_timeline(self) -> list[tuple[float, int]]:
        """(time, running requests from then on), a step function."""
        events = sorted([(r["started"], 1) for r in self.requests] +
                        [(r["ended"], -1) for r in self.requests])
        running, out = 0, [(0.0, 0)]
        for t, d in events:
            running += d
            out.append((t, running))
        return out

    @property
    def mean_active(self) -> float:
        """Running requests averaged over generation time (pause windows excluded)."""
        timeline = self.active_timeline()
        end = self.all_work_s
        area = generating = 0.0
        for (t0, n), (t1, _) in zip(timeline, [*timeline[1:], (end, 0)], strict=True):
            t0, t1 = max(0.0, min(t0, end)), max(0.0, min(t1, end))
            for a, b in _minus(t0, t1, self.pauses):
                area += n * (b - a)
                generating += b - a
        return area / generating if generating else 0.0

    @property
    def accepted_groups_per_hour(self) -> float:
        """Accepted groups per hour from batch 1 ready to the last trained batch ready."""
        k = min(len(self.ready), max(len(self.pauses), 1)) - 1
        if k < 1 or self.ready[k] <= self.ready[0]:
            return float("nan")
        return (self.accepted_at_ready[k] - self.accepted_at_ready[0]) / (
            self.ready[k] - self.ready[0]) * 3600

    @property
    def output_tokens(self) -> int:
        return sum(sum(tokens) for tokens in self.delivered.values())


def wait_for_rq_workers(queue: Queue, count: int, timeout: float = 120.0) -> None:
    """Until *count* RQ workers listen on *queue*: work submitted before would wait for
    processes still starting, which is no cost of the farm's (or of RQ's)."""
    deadline = time.monotonic() + timeout
    while Worker.count(queue=queue) < count:
        if time.monotonic() > deadline:
            raise InvariantViolation(f"bench: fewer than {count} RQ workers after {timeout:g}s")
        time.sleep(0.1)


def _minus(a: float, b: float, windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [a, b) outside every window."""
    parts = [(a, b)] if b > a else []
    for w0, w1 in windows:
        parts = [piece for x, y in parts
                 for piece in ((x, min(y, w0)), (max(x, w1), y)) if piece[1] > piece[0]]
    return parts


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

    def engine_section(self) -> dict[str, object]:
        s, f = self.shape, self.scale.step_factor
        return {"kind": "sim", "replicas": s.replicas, "slots_per_replica": s.slots_per_replica,
                "threads_per_process": s.slots_per_replica, "step_ms": s.step_ms * f,
                "step_ms_per_request": s.step_ms_per_request * f,
                **self.kv_settings()}

    def kv_settings(self) -> dict[str, Any]:
        """The engine model's prefill and KV settings at this scale: sizes scale with
        tokens, the prefill rate so that a prefill takes the scaled time."""
        s, scale = self.shape, self.scale
        return {"prefill_tokens_per_s": s.prefill_tokens_per_s / scale.step_factor,
                "chunked_prefill_size": scale.length(s.chunked_prefill_size),
                "max_total_tokens": scale.length(s.max_total_tokens)}

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

    def rollout(self, mode: str, max_staleness: int) -> dict[str, object]:
        s = self.shape
        rollout: dict[str, object] = {
            "group_size": s.group_size, "batch_size": s.batch_size,
            "max_concurrent_rollouts": s.slots // s.group_size, "max_staleness": max_staleness}
        if mode == "sample":
            rollout["max_concurrent_samples"] = s.slots
        return rollout

    # -- one mode ----------------------------------------------------------------------

    def run_mode(self, profile: Profile, mode: str, prompts: list[dict[str, Any]],
                 max_staleness: int) -> ModeRun:
        self.runs += 1
        s, train_s = self.shape, self.shape.train_s * self.scale.time
        state = self.workdir / f"run-{self.runs}"
        config = msgspec.convert({
            "farm": {"name": f"bench-{self.runs}-{profile.name}-{mode}",
                     "redis_url": self.redis_url, "state_dir": str(state)},
            "rollout": self.rollout(mode, max_staleness),
            "engine": self.engine_section(),
            "collector": {"step_ms": self.scale.collector_step_ms},
            "metrics": {"port": free_port()},
            "timeouts": {"shutdown_grace": 2, "pause_barrier": 30},
        }, Config)
        state.mkdir(parents=True, exist_ok=True)
        farm = LocalFarm(config, state / "farm.toml", engine_urls=self.engine_urls,
                         log_dir=state if self.logs else None)
        farm.start()
        stop = threading.Event()
        run = ModeRun(mode, s.slots)
        try:
            client = RolloutClient(Ledger.from_config(connect(self.redis_url), config), config)
            farm.wait_ready(stop)
            wait_for_rq_workers(episode_queue(client.ledger.client, client.ledger.keys), s.slots)
            batches = -(-len(prompts) // s.batch_size)
            t0 = time.monotonic()
            client.submit(prompts)
            view = LiveView(f"{profile.name} {mode}", batches, "batches")
            for k in range(batches):
                batch = client.get_batch(timeout=1800, max_poll_s=self.scale.trainer_poll_s)
                now = time.monotonic() - t0
                run.ready.append(now)
                run.accepted_at_ready.append(client.ledger.counters().get("accepted", 0))
                for g in batch.groups:
                    run.delivered[g.id] = [len(m.output_ids) for m in g.members]
                    run.delivered_prompts.append(g.prompt)
                training = k < s.train_batches  # then the drain: no pause, no training
                client.train_step(batch, stand_in_training(train_s if training else 0.0),
                                  pause=training)
                if training:
                    run.pauses.append((now, time.monotonic() - t0))
                self.progress(f"{profile.name} {mode}: batch {k + 1}/{batches} ready at "
                              f"{now:.2f}s")
                view.show(k + 1, ready=f"{now:.1f}s")
            view.close()
            run.counters = client.ledger.counters()
            run.doctor_problems = examine(client.ledger.client, client.ledger.keys,
                                          s.batch_size).problems
            run.requests = self._requests(t0, t0 + run.all_work_s + 1.0)
        finally:
            stop.set()
            farm.stop()
        run.ideal = self.ideal(prompts, mode, max_staleness, f"ideal-{self.runs}")
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
              farm: str, pause_mode: PauseMode = "in_place") -> SimReport:
        """The ideal schedule of the same policy: the same ledger scripts and engine
        model in virtual time, with zero control-plane overhead."""
        s, f = self.shape, self.scale.step_factor
        clock = ManualClock()
        rollout = msgspec.convert(self.rollout(mode, max_staleness), RolloutConfig)
        ledger = Ledger(connect(self.redis_url), farm, rollout, clock=clock)
        return SimFarm(
            ledger, clock, {p["id"]: p["member_lengths"] for p in prompts},
            replicas=s.replicas, slots_per_replica=s.slots_per_replica,
            step_ms=s.step_ms * f, step_ms_per_request=s.step_ms_per_request * f,
            train_s=s.train_s * self.scale.time, train_batches=s.train_batches,
            capacity_slots=s.slots, **self.kv_settings(), pause_mode=pause_mode,
            prompt_tokens={p["id"]: len(text_tokens(p["prompt"])) for p in prompts},
        ).run()


def audit(prompts: list[dict[str, Any]], runs: list[ModeRun], group_size: int) -> list[str]:
    """Every problem found; empty when the runs are sound."""
    problems: list[str] = []
    want = {p["id"]: p["member_lengths"] for p in prompts}
    digest = manifest_digest(prompts)
    for run in runs:
        tag = f"{run.mode} mode"
        if run.delivered_digest != digest:
            problems.append(f"{tag}: the prompts delivered differ from the manifest")
        if set(run.delivered) != set(want):
            missing = sorted(set(want) - set(run.delivered))[:5]
            problems.append(f"{tag}: {len(want) - len(run.delivered)} groups not delivered "
                            f"(e.g. {missing})")
        for gid, tokens in run.delivered.items():
            if tokens != want.get(gid):
                problems.append(f"{tag}: group {gid} members produced {tokens}, "
                                f"expected {want.get(gid)}")
        rids = [r["rid"] for r in run.requests]
        episodes = len(want) * group_size
        if len(rids) != len(set(rids)):
            problems.append(f"{tag}: an rid was sent to the replicas twice")
        if len(rids) != episodes:
            problems.append(f"{tag}: the replicas ran {len(rids)} requests for {episodes} "
                            "episodes")
        if sum(r["tokens"] for r in run.requests) != run.output_tokens:
            problems.append(f"{tag}: the replicas generated "
                            f"{sum(r['tokens'] for r in run.requests)} tokens, the results "
                            f"hold {run.output_tokens}")
        if run.counters.get("finished", 0) != episodes:
            problems.append(f"{tag}: {run.counters.get('finished', 0)} episodes finished, "
                            f"expected {episodes}")
        problems += [f"{tag}: doctor: {p}" for p in run.doctor_problems]
    return problems


def mode_json(run: ModeRun, scale: Scale) -> dict[str, object]:
    ideal = run.ideal
    ideal_all = ideal.all_work_s if ideal else float("nan")
    return {
        "mean_rollout_interval_s": round(run.mean_rollout_interval, 3),
        "all_work_completion_s": round(run.all_work_s, 3),
        "mean_active_episodes": round(run.mean_active, 2),
        "slot_occupancy": round(run.mean_active / run.slots, 4),
        "ideal_ratio": round(run.all_work_s / ideal_all, 4),
        "accepted_groups_per_hour": round(run.accepted_groups_per_hour, 1),
        "output_tokens": run.output_tokens,
        "reference": {  # scaled back to the reference's seconds and tokens
            "mean_rollout_interval_s": round(run.mean_rollout_interval / scale.time, 2),
            "all_work_completion_s": round(run.all_work_s / scale.time, 2),
            "accepted_groups_per_hour": round(run.accepted_groups_per_hour * scale.time, 1),
            "output_tokens": round(run.output_tokens / scale.tokens),
        },
        "ideal": None if ideal is None else {
            "mean_rollout_interval_s": round(ideal.mean_rollout_interval, 3),
            "all_work_completion_s": round(ideal.all_work_s, 3),
            "mean_active_episodes": round(ideal.mean_active, 2),
            "slot_occupancy": round(ideal.slot_occupancy, 4),
        },
    }


CHANGE_KEYS = ("mean_rollout_interval_s", "all_work_completion_s", "mean_active_episodes",
               "slot_occupancy", "ideal_ratio", "accepted_groups_per_hour", "output_tokens")


def pilot_json(profile: Profile, shape: Shape, scale: Scale, max_staleness: int,
               group: ModeRun, sample: ModeRun) -> dict[str, object]:
    modes = {"group": mode_json(group, scale), "sample": mode_json(sample, scale)}
    change = {k: round(modes["sample"][k] / modes["group"][k] - 1, 4)  # type: ignore[operator]
              if modes["group"][k] else None for k in CHANGE_KEYS}
    return {"profile": profile.name, "scale": scale.as_json(),
            "shape": {"prompts": shape.prompts, "group_size": shape.group_size,
                      "batch_size": shape.batch_size, "replicas": shape.replicas,
                      "slots": shape.slots, "max_staleness": max_staleness,
                      "train_s": shape.train_s, "train_batches": shape.train_batches},
            "modes": modes, "change": change}


def run_pilot(bench: Bench, profile: Profile, max_staleness: int
              ) -> tuple[dict[str, object], dict[str, ModeRun]]:
    """Group admission, then sample refill, over one manifest; audited. Raises
    :class:`InvariantViolation` listing every problem the audit found."""
    prompts = profile.manifest(bench.shape, bench.scale)
    runs = {mode: bench.run_mode(profile, mode, prompts, max_staleness)
            for mode in ("group", "sample")}
    problems = audit(prompts, list(runs.values()), bench.shape.group_size)
    if problems:
        raise InvariantViolation(f"bench {profile.name}: audit failed: " + "; ".join(problems[:10]))
    return pilot_json(profile, bench.shape, bench.scale, max_staleness,
                      runs["group"], runs["sample"]), runs


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
