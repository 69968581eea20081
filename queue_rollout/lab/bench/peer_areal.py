"""The peer-areal profile: AReaL's own rollout and the farm, on the same replicas, over
the same work, in the same trainer order.

Three contenders, each run audited (every group delivered once, every member's exact
length, every token generated once):

- ``areal``: AReaL 1.0.4's remote SGLang engine and workflow executor
  (:mod:`queue_rollout.lab.bench.areal_rollout`, run in AReaL's venv), configured from
  the shape: ``consumer_batch_size`` = B, ``max_concurrent_rollouts`` = the slots / G
  (group admission's concurrency), ``max_head_offpolicyness`` = ``max_staleness``;
- ``farm-group``: the farm, group admission, the replicas paused in ``abort`` mode;
- ``farm-sample``: the farm, sample refill, the same.

All three keep AReaL's trainer order: generation goes on during the fixed training
pause; then pause, a weight update that reloads the same weights, the version raised,
resume. Two settings: ``real`` (the real-sglang profile's two pinned SGLang replicas
on this machine's CPU: its long tail, ``repeats`` runs a contender in alternating
order, and its equal control, one run a contender) and ``sim`` (simulated replicas at
the reference shape, B16 x G8 over 128 slots, seven 1,024-token members and one of
16,384 a group, scaled in time as the pilots are, ``repeats`` runs a contender
alternating). Medians with their ranges.

The control plane's price (``sim``: the simulated replicas cost almost no CPU):
one-token episodes through AReaL's engine and through the farm (group admission, no
training), so that nearly all of each episode's time is the path around the engine:
episodes per second; per episode the time from its admission (the farm: the ledger
admitting its group; AReaL: its workflow sending it) to its batch reaching the trainer,
less the replica's own time for it (its request log), p50 and p99; CPU seconds per
episode (the farm: its processes and Redis; AReaL: its one process).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from queue_rollout.engines.base import episode_seed
from queue_rollout.errors import ConfigError, InvariantViolation, QueueRolloutError
from queue_rollout.lab.bench.audit import audit
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import Bench
from queue_rollout.lab.bench.real_sglang import (
    POOL_TOKENS,
    PROMPTS,
    SHORT_TOKENS,
    RealBench,
    engine_config,
    profiles,
    real_shape,
    spread,
)
from queue_rollout.lab.bench.results import shape_json
from queue_rollout.lab.sim.model import PROMPT_HEAD
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import PILOTS
from queue_rollout.lab.workloads.profile import Profile, unit
from queue_rollout.launch.node import check_engine_python, replica_env
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.history import read_story
from queue_rollout.ledger.keys import Keys
from queue_rollout.procs import log_tail

CONTENDERS = ("areal", "farm-group", "farm-sample")
REPEATS = 3
PROMPT_TOKENS = 16  # each group's prompt: token ids of its own
#: The figures the table compares.
FIGURES = ("all_work_s", "mean_rollout_interval_s", "mean_update_pause_s",
           "slot_occupancy", "requests_per_episode")
ONE_TOKEN = Profile("one-token", "8 x 1 token per group",
                    lengths=lambda prompts, g: {f"ot-{i:04d}": [1] * g for i in range(prompts)})
CONTROL_PROMPTS = 128  # one-token groups: 1,024 episodes a contender


def areal_python() -> str:
    """AReaL's venv's Python (``QUEUE_ROLLOUT_AREAL_PYTHON``), checked to import AReaL's
    remote SGLang engine; a :class:`ConfigError` saying what to do otherwise."""
    python = os.environ.get("QUEUE_ROLLOUT_AREAL_PYTHON", "")
    if not python:
        raise ConfigError("bench peer-areal runs AReaL's own rollout in AReaL's venv: set "
                          "QUEUE_ROLLOUT_AREAL_PYTHON to its python (.ci/run builds one: "
                          "see docs/en/developing.md)")
    try:
        subprocess.run([python, "-c", "import areal.engine.sglang_remote, "
                        "areal.infra.workflow_executor, queue_rollout"],
                       check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        said = getattr(e, "stderr", b"") or b""
        raise ConfigError(f"QUEUE_ROLLOUT_AREAL_PYTHON={python} cannot import AReaL's remote "
                          "SGLang engine and this package: "
                          + (said.decode(errors="replace").strip().splitlines() or [str(e)])[-1]
                          ) from None
    return python


def peer_prompts(profile: Profile, shape: Shape, scale: Scale) -> list[dict[str, Any]]:
    """*profile*'s manifest with each group's prompt as token ids (AReaL's engine sends
    ids): :data:`PROMPT_TOKENS` of its own, within any model's vocabulary, the first
    different for each of up to 1,900 groups."""
    out = []
    for i, p in enumerate(profile.manifest(shape, scale)):
        # the first id is the group's own (a replica's log tells the groups apart by it)
        step = 1 + int(unit("peer", p["id"]) * 1_000)
        ids = [50 + (i + step * k) % 1_900 for k in range(PROMPT_TOKENS)]
        out.append({k: v for k, v in p.items() if k != "prompt"} | {"input_ids": ids})
    return out


# -- one run of each contender --------------------------------------------------------


@dataclass
class Setting:
    """Where the contenders run: a started bench, its replicas' weights folder, and
    AReaL's python."""

    bench: Bench
    weights: Path
    python: str

    def run(self, contender: str, profile: Profile, prompts: list[dict[str, Any]],
            shape: Shape | None = None) -> ModeRun:
        """One run of *contender* over *prompts*, at *shape* (default: the bench's; the
        replicas stay as started)."""
        saved = self.bench.shape
        shape = shape or saved
        self.bench.shape = shape
        try:
            if contender == "areal":
                go: Callable[[], ModeRun] = lambda: run_areal(self, prompts)  # noqa: E731
            else:
                mode = contender.removeprefix("farm-")
                go = lambda: self.bench.run_mode(  # noqa: E731
                    profile, mode, prompts, shape.max_staleness, pause_mode="abort",
                    weights=self.weights)
            run = (self.bench.observe_run(go) if isinstance(self.bench, RealBench)
                   else go())
        finally:
            self.bench.shape = saved
        if not isinstance(self.bench, RealBench):  # the replicas' request logs
            run.engine_counters = {"requests": len(run.requests),
                                   "generation_tokens": sum(r["tokens"] for r in run.requests)}
        run.mode = contender
        return run


def run_areal(setting: Setting, prompts: list[dict[str, Any]]) -> ModeRun:
    """One run of AReaL's own rollout on the bench's replicas, as a :class:`ModeRun`."""
    bench = setting.bench
    bench.runs += 1
    s, scale = bench.shape, bench.scale
    workdir = bench.workdir / f"run-{bench.runs}-areal"
    workdir.mkdir(parents=True, exist_ok=True)
    spec = {"addresses": [u.removeprefix("http://") for u in bench.engine_urls],
            "prompts": prompts, "batch_size": s.batch_size,
            "max_concurrent_rollouts": max(1, s.slots // s.group_size),
            "max_staleness": s.max_staleness, "batches": -(-len(prompts) // s.batch_size),
            "train_batches": s.train_batches, "train_s": s.train_s * scale.time,
            "weights": str(setting.weights), "workdir": str(workdir)}
    (workdir / "spec.json").write_text(json.dumps(spec))
    log = workdir / "areal.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [setting.python, "-m", "queue_rollout.lab.bench.areal_rollout",
             str(workdir / "spec.json"), str(workdir / "out.json")],
            stdout=out, stderr=out, timeout=1800, check=False,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    if done.returncode != 0:
        raise QueueRolloutError(f"AReaL's rollout exited {done.returncode}; the end of {log}:\n"
                                + log_tail(log, 30))
    result = json.loads((workdir / "out.json").read_text())
    t0 = result["started_at"]
    return areal_run(result, prompts, s,
                     bench._requests(t0, t0 + result["seconds"] + 1.0))


def areal_run(result: dict[str, Any], prompts: list[dict[str, Any]], shape: Shape,
              requests: list[dict[str, Any]] | None = None) -> ModeRun:
    """What AReaL's run reported (:mod:`~queue_rollout.lab.bench.areal_rollout`'s OUT) as
    a :class:`ModeRun`; the replicas' request log entries are set by the caller."""
    by_id = {p["id"]: p for p in prompts}
    run = ModeRun("areal", shape.slots, batch_size=shape.batch_size,
                  started_at=result["started_at"])
    delivered_at = {e["group"]: e["delivered"] for e in result["episodes"]
                    if e["delivered"] is not None}
    for batch in result["batches"]:
        run.ready.append(batch["ready"])
        if "paused" in batch:
            run.pauses.append((batch["paused"], batch["resumed"]))
        for row in batch["groups"]:
            run.delivered[row["group"]] = row["lengths"]
            run.delivered_turns[row["group"]] = [[n] for n in row["lengths"]]
            run.delivered_prompts.append(by_id[row["group"]])
            run.delivered_at[row["group"]] = delivered_at[row["group"]]
            run.accepted_at[row["group"]] = row["done"]
        run.accepted_at_ready.append(len(run.delivered))
    run.counters = {"finished": sum(len(v) for v in run.delivered.values())}
    run.sent = {(e["group"], e["member"]): e["sent"] for e in result["episodes"]}
    run.cpu_s = result["cpu_s"]
    run.requests = requests or []
    return run


def audit_runs(prompts: list[dict[str, Any]], runs: list[ModeRun], what: str) -> None:
    problems = audit(prompts, runs, request_logs=False, resumed=True)
    if problems:
        raise InvariantViolation(f"bench peer-areal {what}: audit failed: "
                                 + "; ".join(problems[:10]))


# -- figures --------------------------------------------------------------------------


def figures(run: ModeRun) -> dict[str, float | None]:
    episodes = sum(len(v) for v in run.delivered.values())
    requests = run.engine_counters.get("requests")

    def num(x: float) -> float | None:
        return None if x != x else round(x, 4)  # nan: none

    return {"all_work_s": num(run.all_work_s),
            "mean_rollout_interval_s": num(run.mean_rollout_interval),
            "mean_update_pause_s": num(run.mean_pause_s),
            "slot_occupancy": num(run.mean_active / run.slots),
            "requests_per_episode": None if requests is None else round(requests / episodes, 3)}


def summary(runs: dict[str, list[ModeRun]]) -> dict[str, dict[str, Any]]:
    """Per contender and figure: the median, range and each run's value."""
    return {name: {k: spread([figures(r)[k] for r in name_runs]) for k in FIGURES}
            for name, name_runs in runs.items()}


def alternate(setting: Setting, profile: Profile, prompts: list[dict[str, Any]],
              repeats: int, label: str) -> dict[str, Any]:
    """Every contender *repeats* times in alternating order, audited; the summary."""
    runs: dict[str, list[ModeRun]] = {c: [] for c in CONTENDERS}
    started = time.monotonic()
    for k in range(repeats):
        for c in CONTENDERS:
            setting.bench.progress(f"peer-areal {label}: {c}, run {k + 1} of {repeats}")
            run = setting.run(c, profile, prompts)
            runs[c].append(run)
            setting.bench.progress(f"peer-areal {label} {c}: all work in {run.all_work_s:.1f}s")
    audit_runs(prompts, [r for rs in runs.values() for r in rs], label)
    return {"workload": profile.name, "summary": profile.summary, "repeats": repeats,
            "contenders": summary(runs), "minutes": round((time.monotonic() - started) / 60, 1)}


# -- the control plane's price --------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def control_price(setting: Setting, groups: int = CONTROL_PROMPTS) -> dict[str, Any]:
    """One-token episodes through AReaL's engine and the farm's group admission, no
    training, in two passes: every slot busy (*groups* groups at the bench's shape:
    episodes per second, CPU per episode), and one group at a time in batches of one
    group (*groups* / 2: each episode's time around the engine, nothing queued)."""
    bench = setting.bench
    busy = replace(bench.shape, prompts=groups, train_batches=0)
    alone = replace(busy, prompts=max(2, groups // 2), batch_size=1, slots_per_replica=1,
                    replicas=busy.group_size)
    out: dict[str, Any] = {"workload": ONE_TOKEN.summary, "busy": {}, "alone": {}}
    for name, shape in (("busy", busy), ("alone", alone)):
        prompts = peer_prompts(ONE_TOKEN, shape, bench.scale)
        areal = setting.run("areal", ONE_TOKEN, prompts, shape)
        farm = setting.run("farm-group", ONE_TOKEN, prompts, shape)
        audit_runs(prompts, [areal, farm], f"control plane ({name})")
        episodes = len(prompts) * shape.group_size
        out[name] = {"episodes": episodes, "groups_in_flight": shape.slots // shape.group_size,
                     "batch_size": shape.batch_size,
                     "areal": price_side(areal, areal_paths(areal, prompts), episodes,
                                         areal.cpu_s or 0.0),
                     "farm": price_side(farm, farm_paths(farm, prompts, bench.redis_url),
                                        episodes, (farm.cpu_s or 0.0)
                                        + (farm.redis.cpu_s if farm.redis else 0.0))}
    return out


Paths = tuple[list[float], list[float]]  # per episode: to ready, to delivered (seconds)


def areal_paths(run: ModeRun, prompts: list[dict[str, Any]]) -> Paths:
    """Per episode, from sending it to its group accepted and to its batch delivered,
    less the replica's time for it. AReaL sends no rid: a group's requests are known by
    its prompt, its one-token members alike (the earliest sent with the earliest
    arrived)."""
    by_head: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for r in run.requests:
        by_head.setdefault(tuple(r["prompt_head"]), []).append(r)
    sent: dict[str, list[float]] = {}
    for (g, _), at in run.sent.items():
        sent.setdefault(g, []).append(at)
    ready, delivered = [], []
    for p in prompts:
        requests = sorted(by_head.get(tuple(p["input_ids"][:PROMPT_HEAD]), []),
                          key=lambda r: r["arrived"])
        times = sorted(sent.get(p["id"], []))
        if len(requests) != len(times):
            raise InvariantViolation(f"bench peer-areal: group {p['id']}: {len(requests)} "
                                     f"requests in the replicas' logs for {len(times)} sent")
        for at, r in zip(times, requests, strict=True):
            base = at + r["ended"] - r["arrived"]
            ready.append(run.accepted_at[p["id"]] - base)
            delivered.append(run.delivered_at[p["id"]] - base)
    return ready, delivered


def farm_paths(run: ModeRun, prompts: list[dict[str, Any]], redis_url: str) -> Paths:
    """Per episode, from its group's admission (the ledger's history) to the group
    accepted and to its batch delivered, less the replica's time for it (its request,
    known by its sampling seed)."""
    engine = {r["seed"]: r["ended"] - r["arrived"] for r in run.requests}
    ready, delivered = [], []
    client = connect(redis_url)
    try:
        for p in prompts:
            story = read_story(client, Keys(run.farm), p["id"], ttl_s=86_400)
            if story.judged is None:
                raise InvariantViolation(f"bench peer-areal: group {p['id']} delivered, "
                                         "its judgement not in the ledger's history")
            for m in range(len(p["member_lengths"])):
                base = story.admitted_at + engine[episode_seed(0, p["id"], m)]
                ready.append(story.judged.at - base)
                delivered.append(run.delivered_at[p["id"]] - base)
    finally:
        client.close()
    return ready, delivered


def price_side(run: ModeRun, paths: Paths, episodes: int, cpu_s: float) -> dict[str, Any]:
    ready, delivered = paths
    return {"episodes_per_s": round(episodes / run.all_work_s, 1),
            "ready_ms_p50": round(1000 * percentile(ready, 0.5), 2),
            "ready_ms_p99": round(1000 * percentile(ready, 0.99), 2),
            "delivered_ms_p50": round(1000 * percentile(delivered, 0.5), 2),
            "delivered_ms_p99": round(1000 * percentile(delivered, 0.99), 2),
            "cpu_ms_per_episode": round(1000 * cpu_s / episodes, 3)}


# -- the profile ----------------------------------------------------------------------


def sim_setting(workdir: Path, redis_url: str, python: str, shape: Shape,
                progress: Callable[[str], None]) -> Setting:
    bench = Bench(redis_url, shape, Scale(), workdir, progress, predict=False)
    bench.start()
    weights = workdir / "weights"  # a folder the simulated replicas "load"
    weights.mkdir(parents=True, exist_ok=True)
    return Setting(bench, weights, python)


def run_sim(workdir: Path, python: str, *, repeats: int, small: bool,
            progress: Callable[[str], None]) -> dict[str, Any]:
    """The ``sim`` setting: the long tail at the reference shape, then the control
    plane's price. *small*: 32 groups, one training batch, one run a contender."""
    shape = Shape(prompts=32, train_batches=1) if small else Shape()
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    with EmbeddedRedis(workdir / "redis", write_url=False) as redis_server:
        setting = sim_setting(workdir, redis_server.url, python, shape, progress)
        try:
            profile = PILOTS["long-tail"]
            prompts = peer_prompts(profile, shape, setting.bench.scale)
            workload = alternate(setting, profile, prompts, repeats, "sim long-tail")
            progress("peer-areal sim: the control plane's price (one-token episodes)")
            price = control_price(setting, 32 if small else CONTROL_PROMPTS)
        finally:
            setting.bench.stop()
    return {"setting": "sim", "scale": Scale().as_json(),
            "shape": shape_json(shape, shape.max_staleness), "workloads": [workload],
            "control_plane": price, "minutes": round((time.monotonic() - started) / 60, 1)}


def run_real(workdir: Path, python: str, model: Path, sglang_python: str, *, repeats: int,
             cores: tuple[int, int], progress: Callable[[str], None]) -> dict[str, Any]:
    """The ``real`` setting: the real-sglang profile's replicas and workloads, the long
    tail *repeats* times a contender, the equal control once."""
    if not (model / "config.json").exists():
        raise ConfigError(f"--model: {model} holds no model (no config.json)")
    if shutil.which("taskset") is None:
        raise ConfigError("the real setting pins each replica to a core with taskset, "
                          "which is not on PATH (Debian: util-linux)")
    shape = real_shape(PROMPTS, POOL_TOKENS)
    config = engine_config(model, sglang_python, shape)
    check_engine_python(config.engine, replica_env(config, 0))
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    with EmbeddedRedis(workdir / "redis", write_url=False) as redis_server:
        bench = RealBench(redis_server.url, shape, Scale(time=1.0, tokens=1.0), workdir,
                          progress, predict=False, config=config, cores=cores)
        try:
            bench.start()
            setting = Setting(bench, model, python)  # a weight update reloads the model
            long_tail, equal = profiles(SHORT_TOKENS)
            workloads = [alternate(setting, long_tail,
                                   peer_prompts(long_tail, shape, bench.scale), repeats,
                                   "real long-tail"),
                         alternate(setting, equal, peer_prompts(equal, shape, bench.scale),
                                   1, "real equal")]
        finally:
            bench.stop()
    return {"setting": "real", "model": str(model), "cores": list(cores),
            "shape": shape_json(shape, shape.max_staleness), "workloads": workloads,
            "minutes": round((time.monotonic() - started) / 60, 1)}


def run_peer_areal(workdir: Path, *, model: Path | None = None, sglang_python: str = "",
                   repeats: int = REPEATS, cores: tuple[int, int] = (0, 1),
                   small: bool = False, progress: Callable[[str], None] = lambda line: None
                   ) -> dict[str, Any]:
    """Both settings (*small*: the ``sim`` one alone, one run a contender, 32 groups)."""
    python = areal_python()
    if not small and model is None:
        raise ConfigError("--model: peer-areal's real setting needs the model its SGLang "
                          "replicas serve (--small runs the simulated setting alone)")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    started = time.monotonic()
    settings = []
    if not small:
        assert model is not None
        settings.append(run_real(workdir / "real", python, model, sglang_python,
                                 repeats=repeats, cores=cores, progress=progress))
    settings.append(run_sim(workdir / "sim", python, repeats=1 if small else repeats,
                            small=small, progress=progress))
    return {"profile": "peer-areal", "small": small, "contenders": list(CONTENDERS),
            "settings": settings, "minutes": round((time.monotonic() - started) / 60, 1)}


def _cell(s: dict[str, Any], digits: int) -> str:
    if s["median"] is None:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def peer_text(result: dict[str, Any]) -> str:
    """The tables: per setting and workload, each figure per contender (median,
    range); the control plane's price."""
    lines = [f"bench peer-areal: AReaL's own rollout against the farm, {result['minutes']} min"]
    for s in result["settings"]:
        shape = s["shape"]
        where = (f"2 SGLang replicas on cores {s['cores']}" if s["setting"] == "real"
                 else "simulated replicas, time x 0.1, tokens x 0.125")
        lines.append(f"  {s['setting']} ({where}): B{shape['batch_size']} x "
                     f"G{shape['group_size']}, {shape['slots']} slots, {shape['prompts']} "
                     f"groups, max_staleness {shape['max_staleness']}; {s['minutes']} min")
        for w in s["workloads"]:
            lines.append(f"    {w['workload']} ({w['summary']}), {w['repeats']} run(s) a "
                         f"contender, median (range); {w['minutes']} min")
            lines.append(f"      {'figure':24}" + "".join(f"{c:>22}" for c in CONTENDERS))
            for k in FIGURES:
                digits = 3 if k in ("slot_occupancy", "requests_per_episode") else 2
                lines.append(f"      {k:24}" + "".join(
                    f"{_cell(w['contenders'][c][k], digits):>22}" for c in CONTENDERS))
        price = s.get("control_plane")
        if price:
            lines.append(f"    the control plane's price: {price['workload']}, group "
                         "admission, no training; ms per episode beyond the replica's own "
                         "time, from admission to its group accepted (ready) and to its "
                         "batch in the trainer's hands (delivered)")
            keys = ("episodes_per_s", "ready_ms_p50", "ready_ms_p99", "delivered_ms_p50",
                    "delivered_ms_p99", "cpu_ms_per_episode")
            heads = ("episodes/s", "ready p50", "ready p99", "deliv. p50", "deliv. p99",
                     "CPU ms/ep")
            for name in ("busy", "alone"):
                p = price[name]
                lines.append(f"      {name}: {p['episodes']} episodes, "
                             f"{p['groups_in_flight']} group(s) in flight, batches of "
                             f"{p['batch_size']}")
                lines.append(f"        {'':8}" + "".join(f"{h:>12}" for h in heads))
                for side in ("areal", "farm"):
                    lines.append(f"        {side:8}" + "".join(f"{p[side][k]:>12}"
                                                            for k in keys))
    return "\n".join(lines)


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n")
