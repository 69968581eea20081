"""The real-sglang profile: both admission modes on real SGLang replicas, beside what
the engine model, calibrated on group admission alone, predicts for refill.

Two SGLang servers on this machine's CPU, each pinned to a core of its own
(``taskset``, one OpenMP thread), so that one's load does not slow the other; one
embedded Redis; every run gets its own farm (collector, one worker per replica) as the
other pilots do. Two workloads of groups of 4: ``long-tail`` (three members of *L*
tokens and one of 8 *L*, its position rotating by prompt) and the ``equal`` control
(four members of 11 *L* / 4: the same tokens per group). Each runs both admission
modes ``repeats`` times in alternating order (group, sample, group, ...); the median of
each figure is reported with its range. Every run is audited: each group delivered
once, every length exact, the replicas' own counters agreeing (one request per
episode, the tokens delivered generated once), ``doctor`` clean.

The model's side: the replicas' decode logs of the group-admission runs only (SGLang
logs, every few decode steps, the running requests, the tokens they hold and the
throughput since the last line) give the decode step as ``step_ms + step_ms_per_request
x running + step_us_per_context_token x context``, fitted by least squares; a probe
before any run gives the prefill rate. The ideal schedules of both modes under that
calibration are the prediction, set beside the measurement: the refill run is never
fitted. The ideal schedules send their requests with ``ignore_eos``, as the
``controlled_length`` workflow does, so that admission reserves each running request's
whole output as SGLang does for such requests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from queue_rollout.config import Config, PauseMode
from queue_rollout.engines.base import EngineClient
from queue_rollout.engines.client import engine_client
from queue_rollout.engines.concurrency import SGLANG_METRICS, VLLM_METRICS, metric_totals
from queue_rollout.errors import ConfigError, InvariantViolation, QueueRolloutError
from queue_rollout.lab.bench.audit import audit
from queue_rollout.lab.bench.fit import least_squares
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import Bench
from queue_rollout.lab.bench.results import mode_json, shape_json
from queue_rollout.lab.virtual.ideal import ideal_json, ideal_schedule
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import long_tail_lengths
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.launch.node import (
    CPU_SGLANG_ARGS,
    check_engine_python,
    replica_argv,
    replica_env,
)
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.embedded import EmbeddedRedis, free_port
from queue_rollout.procs import log_tail, spawn

#: SGLang logs a decode line every this many steps (its default is 40): the calibration's
#: samples.
DECODE_LOG_INTERVAL = 10
#: Each replica's KV pool (tokens): every run's running requests fit it.
POOL_TOKENS = 65_536
#: A pool under KV pressure: eight slots of the long tail hold more than it fits (three
#: long members alone, 3 x 1,536 tokens).
KV_POOL_TOKENS = 4096
SHORT_TOKENS = 192  # L: the long-tail's short member; the long one is 8 L
PROMPTS = 16
REPEATS = 3

_DECODE = re.compile(r"Decode batch.*?#running-req: (?P<running>\d+), #token: (?P<tokens>\d+),"
                     r".*?gen throughput \(token/s\): (?P<throughput>[\d.]+)")


def long_tail(short: int) -> Callable[[int, int], dict[str, list[int]]]:
    """Per group three members of *short* tokens and one of 8 x *short*, its position
    rotating by prompt."""
    def lengths(prompts: int, g: int) -> dict[str, list[int]]:
        return long_tail_lengths(prompts, g, short=short, long=8 * short, prefix="rlt")
    return lengths


def equal(short: int) -> Callable[[int, int], dict[str, list[int]]]:
    """Per group every member of 11 x *short* / 4 tokens: the long tail's tokens per
    group of 4, spread evenly."""
    def lengths(prompts: int, g: int) -> dict[str, list[int]]:
        return {f"req-{i:04d}": [round(11 * short / 4)] * g for i in range(prompts)}
    return lengths


def profiles(short: int) -> list[Profile]:
    return [Profile("long-tail", f"groups of 4: 3 x {short} + 1 x {8 * short} tokens",
                    lengths=long_tail(short)),
            Profile("equal", f"groups of 4: 4 x {round(11 * short / 4)} tokens",
                    lengths=equal(short))]


def real_shape(prompts: int = PROMPTS, pool: int = POOL_TOKENS) -> Shape:
    """B4 x G4 over 2 replicas of 8 slots (a batch fills the slots, as in the reference
    shape), a 2 s training pause after each of the first 3 batches, then the drain;
    the engine's figures are placeholders until :func:`calibrate` sets them."""
    return Shape(prompts=prompts, group_size=4, batch_size=4, replicas=2,
                 slots_per_replica=8, max_staleness=2, train_s=2.0, train_batches=3,
                 max_total_tokens=pool)


# -- the replicas ---------------------------------------------------------------------


@dataclass
class RealReplica:
    """One server of *kind* (SGLang or vLLM) pinned to *core*."""

    core: int
    log_path: Path
    kind: str = "sglang"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    #: added to its environment (vLLM's KV space on the CPU)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self, config: Config) -> None:
        """Started on a free port, pinned to its core; :meth:`wait_healthy` waits for it."""
        self.port = free_port()
        argv = ["taskset", "-c", str(self.core),
                *replica_argv(config, self.core, self.port, "bench")]
        env = {**replica_env(config, self.core), "OMP_NUM_THREADS": "1", **self.env}
        with self.log_path.open("ab") as log:
            # a session of its own: stop() ends the scheduler and detokenizer with it
            self.proc = spawn(argv, env=env, stdout=log, stderr=log, start_new_session=True)

    def wait_healthy(self, timeout: float = 600.0) -> None:
        assert self.proc is not None, "launch() first"
        client = engine_client(self.kind, self.url, timeout=5)
        deadline = time.monotonic() + timeout
        while not client.healthy(timeout=5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise QueueRolloutError(f"the {self.kind} server on core {self.core} did not "
                                        f"become healthy; the end of {self.log_path}:\n"
                                        + log_tail(self.log_path, 20))
            time.sleep(1.0)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait(10)

    def counters(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            return metric_totals(answer.read().decode())

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def decode_lines(self, start: int, end: int) -> list[dict[str, float]]:
        """The decode lines its log holds between byte offsets *start* and *end*."""
        with self.log_path.open("rb") as f:
            f.seek(start)
            text = f.read(end - start).decode(errors="replace")
        return [{k: float(v) for k, v in m.groupdict().items()}
                for m in _DECODE.finditer(text)]


#: The replicas' counters each run reports, as the differences over the run, by kind.
ENGINE_COUNTERS = {
    "sglang": {"requests": "sglang:num_requests_total",
               "generation_tokens": "sglang:generation_tokens_total",
               "retractions": SGLANG_METRICS.retracted},
    "vllm": {"requests": "vllm:request_success_total",
             "generation_tokens": "vllm:generation_tokens_total",
             "retractions": VLLM_METRICS.retracted}}
#: What each kind calls its running requests.
RUNNING = {"sglang": SGLANG_METRICS.running, "vllm": VLLM_METRICS.running}


#: A run's samples of the replicas' metrics: (monotonic time, each replica's totals).
Samples = list[tuple[float, list[dict[str, float]]]]


def logged_decode_lines(replicas: list[RealReplica], offsets: list[int],
                        samples: Samples) -> list[dict[str, float]]:
    """SGLang's decode lines the replicas logged since *offsets* (their logs' sizes at
    the run's start); the metric samples are not needed."""
    return [line for r, start in zip(replicas, offsets, strict=True)
            for line in r.decode_lines(start, r.log_size())]


@dataclass
class RealBench(Bench):
    """The :class:`Bench` on real replicas (SGLang, or vLLM: ``config.engine.kind``):
    started, pinned and observed here. *decode_lines* turns one run's log lines (SGLang's
    decode lines) or metric samples (vLLM's) into the calibration's lines."""

    config: Config = field(default_factory=Config)
    cores: tuple[int, ...] = (0, 1)
    replica_env: dict[str, str] = field(default_factory=dict)
    replicas: list[RealReplica] = field(default_factory=list)
    decode: dict[int, list[dict[str, float]]] = field(default_factory=dict)  # run -> lines
    served: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # run -> samples
    prefill_tokens_per_s: float = 0.0
    decode_lines: Callable[[list[RealReplica], list[int], Samples],
                           list[dict[str, float]]] = logged_decode_lines

    @property
    def kind(self) -> str:
        return self.config.engine.kind

    def engine_section(self) -> dict[str, object]:
        s = self.shape
        return {"kind": self.kind, "replicas": s.replicas,
                "slots_per_replica": s.slots_per_replica,
                "threads_per_process": s.slots_per_replica, "deterministic": False,
                "pause_mode": self.config.engine.pause_mode}

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.replicas = [RealReplica(core, self.workdir / f"{self.kind}-core{core}.log",
                                     self.kind, env=self.replica_env)
                         for core in self.cores[: self.shape.replicas]]
        # at once: each starts on its own core
        self.progress(f"real-{self.kind}: starting {self.kind} on cores "
                      + ", ".join(str(r.core) for r in self.replicas))
        for replica in self.replicas:
            replica.launch(self.config)
        for replica in self.replicas:
            replica.wait_healthy()
        self.engine_urls = [r.url for r in self.replicas]
        self.prefill_tokens_per_s = statistics.median(
            prefill_rate(engine_client(self.kind, r.url, timeout=120)) for r in self.replicas)
        self.progress(f"real-{self.kind}: replicas up at {', '.join(self.engine_urls)}; "
                      f"prefill {self.prefill_tokens_per_s:,.0f} tokens/s")

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    def _requests(self, t0: float, t1: float) -> list[dict[str, Any]]:
        return []  # a real replica keeps no request log: its counters and samples do

    @contextlib.contextmanager
    def observed(self, run_number: int) -> Iterator[dict[str, float]]:
        """Around one run: the replicas' counters (the run's differences, in the dict
        yielded), the calibration's lines, and their metrics sampled every 0.1 s
        (absolute monotonic times)."""
        before = [r.counters() for r in self.replicas]
        offsets = [r.log_size() for r in self.replicas]
        samples: Samples = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                with contextlib.suppress(OSError, ValueError):
                    samples.append((time.monotonic(), [r.counters() for r in self.replicas]))

        thread = threading.Thread(target=sample, name="served-sampler", daemon=True)
        thread.start()
        deltas: dict[str, float] = {}
        try:
            yield deltas
        finally:
            stop.set()
            thread.join()
            after = [r.counters() for r in self.replicas]
            for key, name in ENGINE_COUNTERS[self.kind].items():
                deltas[key] = round(sum(a.get(name, 0.0) - b.get(name, 0.0)
                                        for a, b in zip(after, before, strict=True)))
            self.decode[run_number] = self.decode_lines(self.replicas, offsets, samples)
            running = RUNNING[self.kind]
            self.served[run_number] = [(t, int(sum(c.get(running, 0.0) for c in totals)))
                                       for t, totals in samples]

    def run_real(self, profile: Profile, mode: str, prompts: list[dict[str, Any]],
                 adaptive: bool = False, pause_mode: PauseMode | None = None,
                 weights: Path | None = None) -> ModeRun:
        """One run of *mode* (audited later), with what the replicas saw attached;
        *pause_mode* and *weights* as :meth:`Bench.run_mode` takes them."""
        return self.observe_run(lambda: self.run_mode(
            profile, mode, prompts, self.shape.max_staleness, adaptive=adaptive,
            pause_mode=pause_mode, weights=weights))

    def observe_run(self, go: Callable[[], ModeRun]) -> ModeRun:
        """The run *go* makes (it counts itself in ``runs``), with the replicas'
        counters and running requests over it attached."""
        number = self.runs + 1
        started = time.monotonic()
        with self.observed(number) as deltas:
            run = go()
        run.engine_counters = dict(deltas)
        t0 = run.started_at or started
        run.served = [(t - t0, n) for t, n in self.served[number]]
        return run


def prefill_rate(client: EngineClient, tokens: int = 2000, tries: int = 3) -> float:
    """Prompt tokens a replica computes per second: a *tokens*-long prompt and a short
    one, each answered with one token, the difference of the fastest of *tries*."""
    def fastest(n: int) -> float:
        best = float("inf")
        for k in range(tries):
            ids = [(97 * (i + 1) + 31 * k + n) % 1900 + 50 for i in range(n)]  # no cache hit
            start = time.monotonic()
            client.generate(f"prefill-probe-{n}-{k}-{time.time_ns()}", input_ids=ids,
                            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                            return_logprob=False, timeout=120)
            best = min(best, time.monotonic() - start)
        return best

    return tokens / max(1e-6, fastest(tokens) - fastest(8))


# -- the calibration ------------------------------------------------------------------


def calibrate(lines: list[dict[str, float]]) -> dict[str, float]:
    """The decode step (ms) as ``step_ms + step_ms_per_request x running +
    step_us_per_context_token x context / 1000`` by least squares over SGLang's decode
    lines (each: the running requests, the tokens they hold, the throughput since the
    line before: a step is running / throughput). A line whose interval held idle time
    (the replica waited for work: a pause, a wave's end) shows a step far slower than it
    was: lines over twice the fit are left out and the rest fitted again, until none
    is. A coefficient the fit makes negative is dropped (set to 0)."""
    rows = [(line["running"], line["tokens"], 1000.0 * line["running"] / line["throughput"])
            for line in lines if line["running"] > 0 and line["throughput"] > 0]
    out: dict[str, float] = {}
    kept_rows = rows
    for _ in range(10):
        if len(kept_rows) < 3:
            raise InvariantViolation(f"calibration: {len(kept_rows)} decode lines in the "
                                     "replicas' logs, too few to fit the decode step")
        out = _fit_step(kept_rows)
        inside = [r for r in rows if r[2] <= 2 * _step(out, r[0], r[1])]
        if inside == kept_rows:
            break
        kept_rows = inside
    residual = [abs(_step(out, n, t) / y - 1) for n, t, y in kept_rows]
    out["lines"] = len(kept_rows)
    out["lines_left_out"] = len(rows) - len(kept_rows)
    out["median_relative_error"] = round(statistics.median(residual), 4)
    return out


NAMES = ("step_ms", "step_ms_per_request", "step_us_per_context_token")


def _step(fitted: dict[str, float], running: float, tokens: float) -> float:
    return (fitted["step_ms"] + fitted["step_ms_per_request"] * running
            + fitted["step_us_per_context_token"] * tokens / 1000.0)


def _fit_step(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    """Least squares of the step on (1, running, context / 1000), a coefficient that
    comes out negative dropped and the rest fitted again."""
    features = [(1.0, n, t / 1000.0) for n, t, _ in rows]
    kept = list(range(len(NAMES)))
    while True:
        solved = least_squares([[f[j] for j in kept] for f in features], [y for *_, y in rows])
        if min(solved) >= 0 or len(kept) == 1:
            break
        kept.pop(min(range(len(kept)), key=lambda i: solved[i]))
    out = dict.fromkeys(NAMES, 0.0)
    for j, value in zip(kept, solved, strict=True):
        out[NAMES[j]] = max(0.0, value)
    return out


def calibrated(shape: Shape, decode: dict[str, float], prefill_tokens_per_s: float) -> Shape:
    return dataclasses.replace(
        shape, step_ms=decode["step_ms"], step_ms_per_request=decode["step_ms_per_request"],
        step_us_per_context_token=decode["step_us_per_context_token"],
        prefill_tokens_per_s=prefill_tokens_per_s)


# -- figures --------------------------------------------------------------------------

#: The figures compared, measured against predicted.
FIGURES = ("mean_rollout_interval_s", "all_work_completion_s", "mean_active_episodes",
           "retractions")


@dataclass(frozen=True)
class Variant:
    """One setting the runs compare: its admission mode, and fixed or adaptive slots."""

    name: str
    mode: str
    adaptive: bool = False


#: Refill against group admission (the baseline first), and adaptive against fixed
#: slots under KV pressure.
MODES = (Variant("group", "group"), Variant("sample", "sample"))
SLOTS = (Variant("fixed", "sample"), Variant("adaptive", "sample", adaptive=True))


def spread(values: list[float | None]) -> dict[str, Any]:
    """The median of *values*, their range and each one."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None, "runs": values}
    return {"median": round(statistics.median(known), 3), "min": min(known),
            "max": max(known), "runs": values}


def _points(measured: float | None, predicted: float | None) -> float | None:
    """predicted - measured, in percentage points."""
    if measured is None or predicted is None:
        return None
    return round(100 * (predicted - measured), 1)


def _change(base: float | None, treated: float | None) -> float | None:
    """treated / base - 1, None where either is unknown or the base is 0."""
    if not base or treated is None:
        return None
    return round(treated / base - 1, 4)


def run_figures(run: ModeRun, shape: Shape) -> dict[str, Any]:
    """One run's figures: its mode's, and the retractions the replicas counted."""
    out = mode_json(run, Scale(time=1.0, tokens=1.0), shape, multi_turn=False)
    out["retractions"] = run.engine_counters.get("retractions")
    return out


def profile_json(profile: Profile, shape: Shape, runs: dict[str, list[ModeRun]],
                 predicted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per variant (*runs* in order: the baseline, then the treatment), each figure's
    median and range over the repeats; the treatment's change against the baseline,
    measured (of the medians) and predicted, and their difference in percentage
    points."""
    base, treated = list(runs)
    variants = {name: {k: spread([run_figures(run, shape)[k] for run in name_runs])
                       for k in FIGURES} for name, name_runs in runs.items()}
    medians = {name: {k: v["median"] for k, v in figs.items()}
               for name, figs in variants.items()}
    change = {k: _change(medians[base][k], medians[treated][k]) for k in FIGURES}
    predicted_change = {k: _change(predicted[base][k], predicted[treated][k]) for k in FIGURES}
    return {
        "profile": profile.name, "summary": profile.summary,
        "variants": variants,
        "predicted": {name: {k: predicted[name][k] for k in FIGURES} for name in predicted},
        "change": change, "predicted_change": predicted_change,
        "difference_pp": {k: _points(change[k], predicted_change[k]) for k in FIGURES},
    }


# -- the profile ----------------------------------------------------------------------


def engine_config(model: Path, python: str, shape: Shape) -> Config:
    """The replicas' config: SGLang on the CPU serving *model* under *python*, its slots
    and KV pool *shape*'s."""
    return msgspec.convert({"engine": {
        "kind": "sglang", "model_path": str(model), "python": python, "deterministic": False,
        "slots_per_replica": shape.slots_per_replica,
        "sglang_args": [*CPU_SGLANG_ARGS, "--max-total-tokens", str(shape.max_total_tokens),
                        "--decode-log-interval", str(DECODE_LOG_INTERVAL)]}}, Config)


def check_setup(profile: str, model: Path, cores: tuple[int, int]) -> None:
    """ConfigError unless *model* holds a model, taskset is there and *cores* are two
    different cores of this machine."""
    if not (model / "config.json").exists():
        raise ConfigError(f"--model: {model} holds no model (no config.json)")
    if shutil.which("taskset") is None:
        raise ConfigError(f"{profile} pins each replica to a core with taskset, which is "
                          "not on PATH (Debian: util-linux)")
    if len(set(cores)) != 2 or max(cores) >= (os.cpu_count() or 1):
        raise ConfigError(f"--cores: two different cores of this machine's "
                          f"{os.cpu_count()}, got {cores}")


def run_real_sglang(model: Path, python: str, workdir: Path, *, kv_pressure: bool = False,
                    repeats: int = REPEATS, short: int = SHORT_TOKENS, prompts: int = PROMPTS,
                    cores: tuple[int, int] = (0, 1),
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Both workloads, both modes, *repeats* times each in alternating order, audited;
    calibrated on the group runs; the prediction beside the measurement. With
    *kv_pressure*: replicas of a small KV pool, the long tail in sample mode with fixed
    and with adaptive slots, calibrated on the fixed runs."""
    check_setup("real-sglang", model, cores)
    shape = real_shape(prompts, KV_POOL_TOKENS if kv_pressure else POOL_TOKENS)
    config = engine_config(model, python, shape)
    check_engine_python(config.engine, replica_env(config, 0))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    started = time.monotonic()
    with EmbeddedRedis(workdir / "redis", write_url=False) as redis_server:
        bench = RealBench(redis_server.url, shape, Scale(time=1.0, tokens=1.0), workdir,
                          progress, predict=False, config=config, cores=cores)
        try:
            bench.start()
            results = ([run_variants(bench, profiles(short)[0], SLOTS, repeats,
                                     redis_server.url)] if kv_pressure else
                       [run_variants(bench, profile, MODES, repeats, redis_server.url)
                        for profile in profiles(short)])
        finally:
            bench.stop()
    return {"profile": "real-sglang-kv" if kv_pressure else "real-sglang",
            "model": str(model), "cores": list(cores),
            "shape": {**shape_json(shape, shape.max_staleness),
                      "pool_tokens": shape.max_total_tokens},
            "repeats": repeats, "prefill_tokens_per_s": round(bench.prefill_tokens_per_s),
            "workloads": results, "seconds": round(time.monotonic() - started, 1)}


def run_variants(bench: RealBench, profile: Profile, variants: tuple[Variant, Variant],
                 repeats: int, redis_url: str) -> dict[str, Any]:
    """Each variant *repeats* times, alternating (baseline, treatment, baseline, ...),
    audited; the model calibrated on the baseline's runs; both variants' ideal
    schedules under that calibration as the prediction."""
    prompts = profile.manifest(bench.shape, bench.scale)
    runs: dict[str, list[ModeRun]] = {v.name: [] for v in variants}
    baseline_runs: list[int] = []
    for k in range(repeats):
        for v in variants:
            bench.progress(f"real-{bench.kind} {profile.name}: {v.name}, run {k + 1} of "
                           f"{repeats}")
            run = bench.run_real(profile, v.mode, prompts, adaptive=v.adaptive)
            runs[v.name].append(run)
            if v is variants[0]:
                baseline_runs.append(bench.runs)
            bench.progress(f"real-{bench.kind} {profile.name} {v.name}: all work in "
                           f"{run.all_work_s:.1f}s, {run.engine_counters.get('retractions')} "
                           "retractions")
    # a pause that aborts sends a call cut short again as a further request
    problems = audit(prompts, [run for name_runs in runs.values() for run in name_runs],
                     request_logs=False, resumed=bench.config.engine.pause_mode == "abort")
    if problems:
        raise InvariantViolation(f"bench real-{bench.kind} {profile.name}: audit failed: "
                                 + "; ".join(problems[:10]))
    decode = calibrate([line for n in baseline_runs for line in bench.decode[n]])
    shape = calibrated(bench.shape, decode, bench.prefill_tokens_per_s)
    client = connect(redis_url)
    try:
        predicted = {v.name: ideal_json(ideal_schedule(
            client, shape, bench.scale, prompts, v.mode, shape.max_staleness,
            f"real-ideal-{profile.name}-{v.name}", adaptive=v.adaptive, ignore_eos=True),
            shape, False)
            for v in variants}
    finally:
        client.close()
    return {**profile_json(profile, shape, runs, predicted),
            "calibration": {k: round(v, 4) for k, v in decode.items()}}


def real_sglang_text(result: dict[str, Any]) -> str:
    """The table: per workload and figure, each variant measured (median, range) and
    predicted, and the change measured, predicted, apart."""
    shape = result["shape"]
    vllm = result["profile"] == "real-vllm"
    source = "windows of vLLM's metrics" if vllm else "decode lines"
    lines = [f"bench {result['profile']}: 2 {'vLLM' if vllm else 'SGLang'} replicas on cores "
             f"{result['cores']} (one "
             f"thread each, a KV pool of {shape['pool_tokens']:,} tokens), "
             f"B{shape['batch_size']} x G{shape['group_size']}, {shape['slots']} slots, "
             f"{shape['prompts']} groups, max_staleness {shape['max_staleness']}, "
             f"{result['repeats']} runs each (median, range); prefill "
             f"{result['prefill_tokens_per_s']:,} tokens/s; {result['seconds']:.0f} s"]
    for w in result["workloads"]:
        c, (base, treated) = w["calibration"], list(w["variants"])
        lines.append(f"  {w['profile']} ({w['summary']}); decode step = {c['step_ms']:.2f} ms "
                     f"+ {c['step_ms_per_request']:.3f} ms x running + "
                     f"{c['step_us_per_context_token']:.3f} us x context token "
                     f"(fitted to {c['lines']:.0f} {source} of the {base} runs, median "
                     f"error {c['median_relative_error']:.1%})")
        lines.append(f"    {'figure':24} {base:>19} {treated:>19} {'change':>8} "
                     f"{'predicted':>10} {'apart':>8}")
        for k in FIGURES:
            cells = []
            for name in (base, treated):
                s = w["variants"][name][k]
                cells.append("-" if s["median"] is None else
                             f"{s['median']:.2f} ({s['min']:.1f}-{s['max']:.1f})")
            ch, pc, pp = w["change"][k], w["predicted_change"][k], w["difference_pp"][k]
            lines.append(f"    {k:24} {cells[0]:>19} {cells[1]:>19} "
                         f"{'-' if ch is None else f'{ch:+.1%}':>8} "
                         f"{'-' if pc is None else f'{pc:+.1%}':>10} "
                         f"{'-' if pp is None else f'{pp:+.1f}pp':>8}")
        lines.append("    predicted: " + "; ".join(
            f"{name} " + ", ".join(f"{k} {w['predicted'][name][k]}" for k in FIGURES)
            for name in (base, treated)))
    return "\n".join(lines)


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n")
