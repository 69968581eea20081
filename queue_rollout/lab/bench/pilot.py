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

import itertools
import json
import math
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rq import Queue, Worker

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import Config, PauseMode
from queue_rollout.engines.sglang import episode_seed, turn_rid
from queue_rollout.errors import InvariantViolation
from queue_rollout.lab.redis_info import Window, read
from queue_rollout.lab.trainer import TakenBatch, run_trainer
from queue_rollout.lab.virtual.farm import SimReport
from queue_rollout.lab.virtual.figures import (
    mean_rollout_interval,
    median_batch_interval,
    num,
    rollout_intervals,
    schedule_figures,
    steady_groups_per_hour,
)
from queue_rollout.lab.virtual.ideal import (
    adaptive_interval_s,
    ideal_json,
    ideal_schedule,
    kv_settings,
    rollout_settings,
    sim_turns,
)
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.profile import Profile, manifest_digest
from queue_rollout.launch.up import LocalFarm, start_sim_engines
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.jobs import episode_queue
from queue_rollout.procs import Supervised, stop_all
from queue_rollout.progress import LiveView


@dataclass
class ModeRun:
    """What one mode's run measured; times in seconds since the prompts were submitted."""

    mode: str
    slots: int
    placement: str = "any"  # rollout.placement
    adaptive: bool = False  # engine.adaptive_slots
    ready: list[float] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)  # trainer's windows
    accepted_at_ready: list[int] = field(default_factory=list)
    delivered: dict[str, list[int]] = field(default_factory=dict)  # group -> member tokens
    delivered_turns: dict[str, list[list[int]]] = field(default_factory=dict)  # per call
    delivered_prompts: list[dict[str, Any]] = field(default_factory=list)  # as the trainer got them
    requests: list[dict[str, Any]] = field(default_factory=list)  # the replicas' log entries
    counters: dict[str, int] = field(default_factory=dict)
    doctor_problems: list[str] = field(default_factory=list)
    in_flight: list[tuple[float, int]] = field(default_factory=list)  # ledger's running
    batch_size: int = 0
    ideal: SimReport | None = None
    #: the bench Redis's own counters from submission to the last batch (every process
    #: of the farm, the trainer's calls too)
    redis: Window | None = None
    started_at: float = 0.0  # when the prompts were submitted (monotonic clock)
    #: real replicas: their own counters' differences over the run, and their running
    #: requests sampled (seconds since submission, count); no request log
    engine_counters: dict[str, float] = field(default_factory=dict)
    served: list[tuple[float, int]] = field(default_factory=list)

    @property
    def delivered_digest(self) -> str:
        return manifest_digest(self.delivered_prompts)

    @property
    def pause_ends(self) -> list[float]:
        return [end for _, end in self.pauses]

    @property
    def rollout_intervals(self) -> list[float]:
        """Batch k (k = 2 .. train_batches): from the end of batch k-1's pause to k ready."""
        return rollout_intervals(self.ready, self.pause_ends)

    @property
    def mean_rollout_interval(self) -> float:
        return mean_rollout_interval(self.ready, self.pause_ends)

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
        """Running requests averaged over generation time (pause windows excluded):
        from the replicas' request logs, else from their own samples."""
        if not self.requests and self.served:
            return self._time_mean([*self.served, (self.all_work_s, 0)])
        return self._time_mean([*self.active_timeline(), (self.all_work_s, 0)])

    @property
    def accepted_groups_per_hour(self) -> float:
        """Accepted groups per hour from batch 1 ready to the last trained batch ready
        (with rolling consumption, no batch trained: to the last batch ready)."""
        if not self.pauses:
            return self.steady_groups_per_hour
        k = min(len(self.ready), max(len(self.pauses), 1)) - 1
        if k < 1 or self.ready[k] <= self.ready[0]:
            return float("nan")
        return (self.accepted_at_ready[k] - self.accepted_at_ready[0]) / (
            self.ready[k] - self.ready[0]) * 3600

    @property
    def output_tokens(self) -> int:
        return sum(sum(tokens) for tokens in self.delivered.values())

    @property
    def steady_groups_per_hour(self) -> float:
        return steady_groups_per_hour(self.ready, self.batch_size)

    @property
    def median_batch_interval(self) -> float:
        return median_batch_interval(self.ready)

    @property
    def mean_in_flight(self) -> float:
        """Attempts running in the ledger (tool waits included), averaged over
        generation time from the samples taken (pause windows excluded)."""
        return self._time_mean(self.in_flight)

    def _time_mean(self, steps: list[tuple[float, int]]) -> float:
        """The mean of a step function ((time, value from then on), in order) from 0
        to all-work, over generation time only (pause windows excluded)."""
        end, area, generating = self.all_work_s, 0.0, 0.0
        for (t0, n), (t1, _) in itertools.pairwise(steps):
            t0, t1 = max(0.0, min(t0, end)), max(0.0, min(t1, end))
            for a, b in _minus(t0, t1, self.pauses):
                area += n * (b - a)
                generating += b - a
        return area / generating if generating else 0.0


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
                 max_staleness: int, placement: str = "any", adaptive: bool = False
                 ) -> ModeRun:
        self.runs += 1
        s, train_s = self.shape, self.shape.train_s * self.scale.time
        state = self.workdir / f"run-{self.runs}"
        workflow = "controlled_turns" if profile.turns else "controlled_length"
        config = msgspec.convert({
            "farm": {"name": f"bench-{self.runs}-{profile.name}-{mode}",
                     "redis_url": self.redis_url, "state_dir": str(state)},
            "rollout": rollout_settings(s, mode, max_staleness, placement, adaptive),
            "workflow": {"name": workflow},
            "engine": {**self.engine_section(), **(self.adaptive_section() if adaptive else {})},
            "collector": {"step_ms": self.scale.collector_step_ms},
            "metrics": {"port": free_port()},
            "timeouts": {"shutdown_grace": 2, "pause_barrier": 30},
        }, Config)
        state.mkdir(parents=True, exist_ok=True)
        farm = LocalFarm(config, state / "farm.toml", engine_urls=self.engine_urls,
                         log_dir=state if self.logs else None)
        farm.start()
        stop = threading.Event()
        run = ModeRun(mode, s.slots, placement, adaptive, batch_size=s.batch_size)
        try:
            client = RolloutClient(Ledger.from_config(connect(self.redis_url), config), config)
            farm.wait_ready(stop)
            wait_for_rq_workers(episode_queue(client.ledger.client, client.ledger.keys), s.slots)
            batches = s.stop_after or -(-len(prompts) // s.batch_size)
            redis_before = read(client.ledger.client)
            t0 = run.started_at = time.monotonic()
            client.submit(prompts)
            sampler = RunningSampler(client.ledger, t0, max(0.01, self.scale.time / 2))
            view = LiveView(f"{profile.name} {mode}", batches, "batches")

            def ready(taken: TakenBatch) -> None:
                run.ready.append(taken.ready)
                run.accepted_at_ready.append(client.ledger.counters().get("accepted", 0))
                for g in taken.batch.groups:
                    run.delivered[g.id] = [len(m.output_ids) for m in g.members]
                    run.delivered_turns[g.id] = [m.turn_lengths for m in g.members]
                    run.delivered_prompts.append(g.prompt)

            def done(taken: TakenBatch) -> None:
                if taken.resumed is not None:
                    run.pauses.append((taken.ready, taken.resumed))
                self.progress(f"{profile.name} {mode}: batch {taken.index + 1}/{batches} "
                              f"ready at {taken.ready:.2f}s")
                view.show(taken.index + 1, ready=f"{taken.ready:.1f}s")

            run_trainer(client, t0, batches=batches, train_batches=s.train_batches,
                        train_s=train_s, timeout=1800, max_poll_s=self.scale.trainer_poll_s,
                        on_ready=ready, on_done=done)
            view.close()
            run.redis = Window.between(redis_before, read(client.ledger.client))
            run.in_flight = sampler.stop()
            run.counters = client.ledger.counters()
            run.requests = self._requests(t0, t0 + run.all_work_s + 1.0)
        finally:
            stop.set()
            farm.stop()
        # examined with the farm stopped: rolling consumption ends with work in flight,
        # and the doctor reads what no process changes meanwhile
        run.doctor_problems = examine(client.ledger.client, client.ledger.keys,
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


class RunningSampler:
    """Samples how many attempts the ledger holds running (its lease set), every
    *period* seconds on a thread, as (seconds since *t0*, count)."""

    def __init__(self, ledger: Ledger, t0: float, period: float) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ledger, t0, period),
                                        name="running-sampler", daemon=True)
        self._thread.start()

    def _run(self, ledger: Ledger, t0: float, period: float) -> None:
        while not self._stop.wait(period):
            count = ledger.client.zcard(ledger.keys.leases)
            self.samples.append((time.monotonic() - t0, int(count)))

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def manifest_turns(prompt: dict[str, Any]) -> list[list[int]]:
    """Each member's output tokens per model call, as the manifest asks."""
    if "member_turns" in prompt:
        return [[t[0] for t in sim_turns(m)] for m in prompt["member_turns"]]
    return [[n] for n in prompt["member_lengths"]]


def audit(prompts: list[dict[str, Any]], runs: list[ModeRun], *, complete: bool = True,
          run_seed: int = 0, request_logs: bool = True) -> list[str]:
    """Every problem found; empty when the runs are sound. *complete*: every group was
    to be delivered (else only what was delivered is checked: rolling consumption stops
    with groups in flight). With *request_logs* (simulated replicas), each delivered
    member's calls are found in the replicas' logs by their sampling seeds: one request
    per call, its exact length, the rids of one attempt's turns."""
    problems: list[str] = []
    want = {p["id"]: manifest_turns(p) for p in prompts}
    for run in runs:
        tag = f"{run.mode} mode" + (f", placement {run.placement}"
                                     if run.placement != "any" else "")
        subset = [p for p in prompts if p["id"] in run.delivered]
        if run.delivered_digest != manifest_digest(subset) or not set(run.delivered) <= set(want):
            problems.append(f"{tag}: the prompts delivered differ from the manifest")
        if complete and set(run.delivered) != set(want):
            missing = sorted(set(want) - set(run.delivered))[:5]
            problems.append(f"{tag}: {len(want) - len(run.delivered)} groups not delivered "
                            f"(e.g. {missing})")
        by_seed: dict[int, list[dict[str, Any]]] = {}
        for r in run.requests:
            by_seed.setdefault(r["seed"], []).append(r)
        calls = 0
        for gid, tokens in run.delivered.items():
            turns = want.get(gid, [])
            if tokens != [sum(t) for t in turns]:
                problems.append(f"{tag}: group {gid} members produced {tokens}, expected "
                                f"{[sum(t) for t in turns]}")
            elif run.delivered_turns.get(gid) != turns:
                problems.append(f"{tag}: group {gid} members' calls produced "
                                f"{run.delivered_turns.get(gid)}, expected {turns}")
            for member, member_turns in enumerate(turns):
                calls += len(member_turns)
                if request_logs:
                    problems += _audit_calls(tag, gid, member, member_turns, by_seed,
                                             run_seed)
        if request_logs:
            rids = [r["rid"] for r in run.requests]
            if len(rids) != len(set(rids)):
                problems.append(f"{tag}: an rid was sent to the replicas twice")
            requests: float | None = len(rids)
            generated: float | None = sum(r["tokens"] for r in run.requests)
        else:  # the replicas' own counters over the run
            requests = run.engine_counters.get("requests")
            generated = run.engine_counters.get("generation_tokens")
        if complete:
            if requests != calls:
                problems.append(f"{tag}: the replicas ran {requests} requests for {calls} "
                                "model calls")
            if generated != run.output_tokens:
                problems.append(f"{tag}: the replicas generated {generated} tokens, the "
                                f"results hold {run.output_tokens}")
            episodes = sum(len(t) for t in want.values())
            if run.counters.get("finished", 0) != episodes:
                problems.append(f"{tag}: {run.counters.get('finished', 0)} episodes "
                                f"finished, expected {episodes}")
        problems += [f"{tag}: doctor: {p}" for p in run.doctor_problems]
    return problems


def _audit_calls(tag: str, gid: str, member: int, lengths: list[int],
                 by_seed: dict[int, list[dict[str, Any]]], run_seed: int) -> list[str]:
    """One delivered member's calls against the replicas' logs."""
    first = episode_seed(run_seed, gid, member)
    aid = None
    for turn, length in enumerate(lengths):
        found = by_seed.get(first if turn == 0 else episode_seed(first, "turn", turn), [])
        where = f"{tag}: group {gid} member {member} call {turn}"
        if len(found) != 1:
            return [f"{where}: {len(found)} requests in the replicas' logs, expected 1"]
        request = found[0]
        aid = request["rid"] if turn == 0 else aid
        if request["tokens"] != length:
            return [f"{where}: {request['tokens']} tokens, expected {length}"]
        if aid is None or request["rid"] != turn_rid(aid, turn):
            return [f"{where}: rid {request['rid']!r} is not turn {turn} of attempt {aid!r}"]
    return []


def mode_json(run: ModeRun, scale: Scale, shape: Shape, multi_turn: bool) -> dict[str, Any]:
    """One mode's figures. *multi_turn*: active episodes are the ledger's running
    attempts (tool waits included); else the replicas' running requests."""
    ideal = run.ideal
    ideal_all = ideal.all_work_s if ideal else math.nan
    active = run.mean_in_flight if multi_turn else run.mean_active
    times = schedule_figures(run.ready, run.pause_ends, shape.batch_size, shape.train_batches)
    out: dict[str, Any] = {
        "mean_rollout_interval_s": num(run.mean_rollout_interval, 3),
        "all_work_completion_s": num(run.all_work_s, 3),
        "mean_active_episodes": round(active, 2),
        "mean_running_requests": round(run.mean_active, 2),
        "slot_occupancy": round(active / run.slots, 4),
        "ideal_ratio": num(run.all_work_s / ideal_all, 4),
        "accepted_groups_per_hour": num(run.accepted_groups_per_hour, 1),
        "output_tokens": run.output_tokens,
        **times,
    }
    out["reference"] = {  # scaled back to the reference's seconds and tokens
        **{k: None if v is None else round(v / scale.time, 2) for k, v in out.items()
           if k.endswith("_s")},
        "accepted_groups_per_hour": num(run.accepted_groups_per_hour * scale.time, 1),
        "output_tokens": round(run.output_tokens / scale.tokens),
    }
    out["ideal"] = None if ideal is None else ideal_json(ideal, shape, multi_turn)
    return out


CHANGE_KEYS = ("mean_rollout_interval_s", "all_work_completion_s", "mean_active_episodes",
               "slot_occupancy", "ideal_ratio", "accepted_groups_per_hour", "output_tokens",
               "first_batch_s", "batches_ready_s", "median_batch_interval_s", "mean_cycle_s",
               "steady_groups_per_hour")


def changes(group: Mapping[str, Any], sample: Mapping[str, Any]) -> dict[str, float | None]:
    """sample / group - 1 for every key both have as a number."""
    return {k: round(sample[k] / group[k] - 1, 4) if group.get(k) and sample.get(k) is not None
            else None for k in CHANGE_KEYS if k in group}


def shape_json(shape: Shape, max_staleness: int) -> dict[str, Any]:
    """The ``shape`` block of a profile's JSON."""
    return {"prompts": shape.prompts, "group_size": shape.group_size,
            "batch_size": shape.batch_size, "replicas": shape.replicas,
            "slots": shape.slots, "max_staleness": max_staleness,
            "train_s": shape.train_s, "train_batches": shape.train_batches,
            "stop_after": shape.stop_after}


def pilot_json(profile: Profile, shape: Shape, scale: Scale, max_staleness: int,
               group: ModeRun, sample: ModeRun) -> dict[str, Any]:
    multi_turn = profile.turns is not None
    modes = {"group": mode_json(group, scale, shape, multi_turn),
             "sample": mode_json(sample, scale, shape, multi_turn)}
    out: dict[str, Any] = {
        "profile": profile.name, "scale": scale.as_json(),
        "shape": shape_json(shape, max_staleness),
        "multi_turn": multi_turn,
        "modes": modes, "change": changes(modes["group"], modes["sample"])}
    if group.ideal is not None and sample.ideal is not None:
        out["ideal_change"] = changes(modes["group"]["ideal"], modes["sample"]["ideal"])
    if profile.seed is not None:
        out["seed"] = dict(profile.seed)
    if profile.calibration is not None:
        out["calibration"] = dict(profile.calibration)
    return out


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
