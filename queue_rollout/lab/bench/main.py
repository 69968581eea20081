"""``queue-rollout bench``: runs the chosen profiles, prints a table (or JSON lines) per
profile as it completes, and with ``--out`` writes a markdown report with plots."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from queue_rollout.config import Placement
from queue_rollout.lab.bench.calibration import calibration_text, run_calibration
from queue_rollout.lab.bench.control_plane import run_control_plane_bench, side_runs
from queue_rollout.lab.bench.gpu_h200 import REFIT_ON_H200, gpu_h200_text, run_gpu_h200
from queue_rollout.lab.bench.kv_pressure import run_kv_pressure
from queue_rollout.lab.bench.ledger import run_ledger_bench
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import Bench, open_bench, run_pilot, window_sweep
from queue_rollout.lab.bench.placement import run_long_prompt
from queue_rollout.lab.bench.report import kv_text, pilot_text, placement_text, write_report
from queue_rollout.lab.bench.seed_pilots import calibration_achieved, refit, sensitivity
from queue_rollout.lab.virtual.hardware import H200
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import KV_PRESSURE, LONG_PROMPT, PILOTS
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.lab.workloads.registry import MULTI_RUN, PILOT_NAMES, pilot_profile
from queue_rollout.lab.workloads.seed import SEED_PILOTS
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.progress import log_to_file

#: Every profile ``--profile all`` runs, in order.
ALL = (*PILOTS, "control-plane", "calibration", "gpu-h200", "ledger", *SEED_PILOTS, *MULTI_RUN)

#: The pilots of several runs each, by name: what runs them and what prints the result.
MULTI_RUN_BENCHES: dict[str, tuple[Callable[[Bench, Profile, int],
                                            tuple[dict[str, Any], dict[str, ModeRun]]],
                                   Callable[[dict[str, Any]], str]]] = {
    LONG_PROMPT.name: (run_long_prompt, placement_text),
    KV_PRESSURE.name: (run_kv_pressure, kv_text),
}


@dataclass(frozen=True)
class BenchArgs:
    profile: str
    json: bool = False
    out: Path | None = None
    max_staleness: int | None = None  # None: the profile's own (else 2)
    time_scale: float | None = None  # None: the profile's own (else 0.1)
    token_scale: float | None = None  # None: the profile's own (else 0.125)
    refit: bool = False  # swe-agentic, boba-math (gpu-h200: both on the H200): fit again
    sensitivity: bool = False  # the seed's pilots: ideal schedules with each choice changed
    cp_workers: int = 8
    cp_episodes: int = 8000
    ledger_clients: int = 8
    ledger_seconds: float = 6.0
    ledger_rounds: int = 3
    wait_replicas: int = 0  # ledger: replicas every change waits for
    placement: Placement = "any"  # pilots, ledger: rollout.placement of the farms measured
    command: str = "queue-rollout bench"  # for the report
    workdir: Path | None = None  # its farms' state and logs (None: a temporary folder)
    verbose: bool = False  # the processes' logs on the terminal instead of in workdir


def pilot_setting(profile: Profile, args: BenchArgs) -> tuple[Shape, Scale]:
    """The shape and scale *profile* runs at: its own, the window and any scale given
    on the command line overriding them."""
    shape = profile.shape or Shape()
    if args.max_staleness is not None:
        shape = dataclasses.replace(shape, max_staleness=args.max_staleness)
    own = profile.scale or Scale()
    return shape, Scale(time=args.time_scale or own.time, tokens=args.token_scale or own.tokens)


def setting_line(shape: Shape, scale: Scale) -> str:
    consumption = (f"rolling consumption to batch {shape.stop_after}" if shape.stop_after
                   else f"a {shape.train_s:g} s training pause after each of "
                        f"{shape.train_batches} batches, then drain")
    return (f"pilots at B{shape.batch_size} x G{shape.group_size}, {shape.slots} slots over "
            f"{shape.replicas} simulated replicas, {shape.prompts} groups, max_staleness "
            f"{shape.max_staleness}, {consumption}; scale: time x{scale.time:g}, tokens "
            f"x{scale.tokens:g} (decode step x{scale.step_factor:g})")


def run_bench(args: BenchArgs, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the profiles *args* names; results on *out*, progress on *err* (the
    process's streams as they are when called)."""
    out, err = out or sys.stdout, err or sys.stderr
    profiles = ALL if args.profile == "all" else (args.profile,)
    if "control-plane" in profiles:  # refuse --episodes now, not after the other profiles
        side_runs(args.cp_episodes)
    started = time.monotonic()
    live = err.isatty()  # a terminal shows live views; the lines go to the log

    def progress(line: str) -> None:
        text = f"[{time.monotonic() - started:7.1f}s] {line}"
        logging.getLogger("queue_rollout.lab.bench").info(text)
        if not live or args.verbose:
            err.write(text + "\n")
            err.flush()

    pilots = [p for p in profiles if p in PILOT_NAMES]
    results: list[dict[str, Any]] = []
    runs: dict[str, dict[str, ModeRun]] = {}
    sweeps: dict[str, list[dict[str, Any]]] = {}

    def emit(result: dict[str, Any], text: str) -> None:
        results.append(result)
        out.write((json.dumps(result) if args.json else text) + "\n")
        out.flush()

    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qr-bench-")))
        else:
            work = args.workdir.resolve()
            shutil.rmtree(work, ignore_errors=True)
            if not args.verbose:
                log_to_file(work / "bench.log")
        redis_server = stack.enter_context(EmbeddedRedis(work / "redis", write_url=False))
        if args.refit:  # gpu-h200: the seed's workloads fitted again on the H200's constants
            on_h200 = args.profile == "gpu-h200"
            for name in REFIT_ON_H200 if on_h200 else (args.profile,):
                fitted = refit(name, redis_server.url, work / "refit" / name, progress,
                               engine=H200 if on_h200 else None)
                emit(fitted, json.dumps(fitted, indent=2))
            profiles, pilots = (), []
        bench: Bench | None = None
        try:
            for name in pilots:
                profile = pilot_profile(name)
                shape, scale = pilot_setting(profile, args)
                if bench is None or (bench.shape, bench.scale) != (shape, scale):
                    if bench is not None:
                        bench.stop()
                    progress(setting_line(shape, scale))
                    bench = open_bench(work / f"pilots-{name}", shape, scale,
                                       redis_server.url, progress, logs=not args.verbose)
                if name in MULTI_RUN_BENCHES:
                    run_several, text = MULTI_RUN_BENCHES[name]
                    result, runs[name] = run_several(bench, profile, shape.max_staleness)
                    emit(result, text(result))
                    continue
                result, runs[name] = run_pilot(bench, profile, shape.max_staleness,
                                               args.placement)
                if name == "long-tail":
                    sweeps[name] = window_sweep(bench, profile)
                    result["ideal_window_sweep"] = sweeps[name]
                if profile.calibration is not None:
                    calibration_achieved(result, runs[name]["group"], profile, shape, scale)
                if args.sensitivity and name in SEED_PILOTS:
                    result["sensitivity"] = sensitivity(name, redis_server.url, scale,
                                                        shape.max_staleness,
                                                        work / "sensitivity", progress)
                emit(result, pilot_text(result))
        finally:
            if bench is not None:
                bench.stop()
        if "control-plane" in profiles:
            cp = run_control_plane_bench(redis_server.url, workers=args.cp_workers,
                                         episodes=args.cp_episodes, progress=progress)
            emit(cp.as_json(), f"bench control-plane: {cp.workers} workers "
                 f"(rq SimpleWorker processes), {cp.episodes} no-op episodes per side\n"
                 f"  farm episodes/s   {cp.farm_episodes_per_s:10.1f}\n"
                 f"  plain RQ jobs/s   {cp.plain_rq_jobs_per_s:10.1f}\n"
                 f"  ratio             {cp.ratio:10.3f}")
        if "calibration" in profiles:
            cal = run_calibration(redis_server.url, work / "calibration", progress)
            emit(cal, calibration_text(cal))
        if "gpu-h200" in profiles:
            gpu = run_gpu_h200(redis_server.url, work / "gpu-h200", progress)
            emit(gpu, gpu_h200_text(gpu))
    if "ledger" in profiles:
        progress(f"ledger: {args.ledger_clients} clients, {args.ledger_seconds:g} s per kind")
        lb = run_ledger_bench(clients=args.ledger_clients, seconds=args.ledger_seconds,
                              rounds=args.ledger_rounds, wait_replicas=args.wait_replicas,
                              placement=args.placement)
        costs = ", ".join(f"{k} {v:g}" for k, v in lb.redis_us_per_call.items())
        waits = (f", each change waiting for {lb.wait_replicas} replica(s)"
                 if lb.wait_replicas else "")
        placed = ", placing groups" if lb.placement == "group" else ""
        emit(lb.as_json(), f"bench ledger: {lb.clients} clients{waits}{placed}\n"
             f"  ledger ops/s (admit, start, finish) {lb.ledger_ops_per_s:12,.0f}\n"
             f"  trivial script calls/s (floor)      {lb.trivial_script_per_s:12,.0f}\n"
             f"  ratio                               {lb.ratio:12.2f}\n"
             f"  Redis time per call (us, one client): {costs}")
    if args.out is not None:
        path = write_report(args.out, results, runs, sweeps, args.command)
        progress(f"report written to {path}")
    progress(f"bench done in {time.monotonic() - started:.0f}s")
    if args.workdir is not None and not args.verbose:
        err.write(f"logs: {args.workdir.resolve()}\n")
    return 0
