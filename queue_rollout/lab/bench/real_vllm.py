"""The real-vllm profile: both admission modes on real vLLM replicas, beside what the
engine model, calibrated on group admission alone, predicts for refill.

As the real-sglang profile (two servers, each pinned to a core of its own with one
OpenMP thread; the long tail and the equal control; both modes ``repeats`` times,
alternating; every run audited on the replicas' own counters, ``doctor`` clean; the
model calibrated on the group runs and the refill runs never fitted), with vLLM's
server: each replica started as ``node`` starts one (``engine.kind = "vllm"``), on this
CPU with float32 weights, eager mode and a KV space of ``KV_SPACE_GB``; the farm pauses
in abort mode, the only mode it takes on vLLM.

The calibration's series are vLLM's own metrics, sampled every 0.1 s during each group
run: ``vllm:iteration_tokens_total_count`` (the engine steps taken),
``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` (of a pool of
``num_gpu_blocks x block_size`` tokens, from ``vllm:cache_config_info``). Over each
window of at least ``WINDOW_S`` in which a replica took steps, a step is the window
over the steps, at the window's mean running requests and held tokens; these windows
are fitted as SGLang's decode lines are (:func:`~.real_sglang.calibrate`). The ideal
schedules are the engine model's (SGLang's scheduler): a model of vLLM's own scheduler
is not part of it, and the gap says what that costs.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from queue_rollout.config import Config
from queue_rollout.engines.concurrency import VLLM_METRICS
from queue_rollout.errors import ConfigError, QueueRolloutError
from queue_rollout.lab.bench.real_sglang import (
    MODES,
    PROMPTS,
    REPEATS,
    SHORT_TOKENS,
    RealBench,
    RealReplica,
    Samples,
    check_setup,
    profiles,
    real_shape,
    run_variants,
)
from queue_rollout.lab.bench.results import shape_json
from queue_rollout.lab.virtual.shape import Scale
from queue_rollout.launch.node import check_engine_python, replica_env
from queue_rollout.ledger.embedded import EmbeddedRedis

#: The model's length each replica serves (the tiny model's positions).
MAX_MODEL_LEN = 4096
#: vLLM's KV space on the CPU (GB, ``VLLM_CPU_KVCACHE_SPACE``).
KV_SPACE_GB = 1
#: The launch arguments a CPU build of vLLM serves the tiny model with.
CPU_VLLM_ARGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len",
                 str(MAX_MODEL_LEN))
#: The environment a CPU build of vLLM serves with here: its KV space, no hub lookups.
CPU_VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GB), "HF_HUB_OFFLINE": "1"}
#: The shortest window a step is measured over (s).
WINDOW_S = 1.0
#: Fewer steps than this in a window say nothing of a step's time (an idle window).
MIN_STEPS = 5
STEPS = "vllm:iteration_tokens_total_count"
_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.M)


def pool_tokens(metrics: str) -> int:
    """The replica's KV pool in tokens: ``num_gpu_blocks x block_size`` as its
    ``vllm:cache_config_info`` labels say."""
    m = _INFO.search(metrics)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"])) if m else {}
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        raise QueueRolloutError("vLLM's /metrics has no vllm:cache_config_info with "
                                "num_gpu_blocks and block_size") from None


def step_windows(samples: Samples, pools: list[int],
                 window_s: float = WINDOW_S) -> list[dict[str, float]]:
    """Each replica's steps over windows of at least *window_s*, as the calibration's
    lines (``running``, ``tokens`` held, ``throughput`` = running / step): from its
    step counter, its running requests and its KV usage times its pool (*pools*, in
    the replicas' order). A window with fewer than ``MIN_STEPS`` steps or no running
    request is left out."""
    lines: list[dict[str, float]] = []
    for r, pool in enumerate(pools):
        start = 0
        for end in range(1, len(samples)):
            (t0, first), (t1, last) = samples[start], samples[end]
            if t1 - t0 < window_s:
                continue
            seen = [totals[r] for _, totals in samples[start:end + 1]]
            steps = last[r].get(STEPS, 0.0) - first[r].get(STEPS, 0.0)
            running = statistics.fmean(c.get(VLLM_METRICS.running, 0.0) for c in seen)
            if steps >= MIN_STEPS and running > 0:
                held = pool * statistics.fmean(c.get(VLLM_METRICS.token_usage, 0.0)
                                               for c in seen)
                lines.append({"running": running, "tokens": held,
                              "throughput": running * steps / (t1 - t0)})
            start = end
    return lines


def engine_config(model: Path, python: str, slots: int) -> Config:
    """The replicas' config: vLLM serving *model* under *python* as ``node`` starts it,
    with *slots* sequences at most and the CPU's arguments; the farm pauses in abort
    mode."""
    return msgspec.convert({"engine": {
        "kind": "vllm", "model_path": str(model), "python": python, "deterministic": False,
        "slots_per_replica": slots, "pause_mode": "abort",
        "vllm_args": list(CPU_VLLM_ARGS)}}, Config)


def _metrics(replica: RealReplica) -> str:
    with urllib.request.urlopen(replica.url + "/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
        return text


def run_real_vllm(model: Path, python: str, workdir: Path, *, repeats: int = REPEATS,
                  short: int = SHORT_TOKENS, prompts: int = PROMPTS,
                  cores: tuple[int, int] = (0, 1),
                  progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Both workloads, both modes, *repeats* times each in alternating order, audited;
    calibrated on the group runs' metrics; the prediction beside the measurement."""
    check_setup("real-vllm", model, cores)
    if not any(model.glob("*.safetensors")):
        raise ConfigError(f"--model: {model} holds no *.safetensors weights")
    shape = real_shape(prompts)
    config = engine_config(model, python, shape.slots_per_replica)
    check_engine_python(config.engine, replica_env(config, 0))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    started = time.monotonic()
    pools: list[int] = []

    def windows(replicas: list[RealReplica], offsets: list[int],
                samples: Samples) -> list[dict[str, float]]:
        return step_windows(samples, pools)

    with EmbeddedRedis(workdir / "redis", write_url=False) as redis_server:
        bench = RealBench(redis_server.url, shape, Scale(time=1.0, tokens=1.0), workdir,
                          progress, predict=False, config=config, cores=cores,
                          replica_env=CPU_VLLM_ENV,
                          decode_lines=windows)
        try:
            bench.start()
            pools += [pool_tokens(_metrics(r)) for r in bench.replicas]
            bench.shape = dataclasses.replace(shape, max_total_tokens=min(pools))
            results = [run_variants(bench, profile, MODES, repeats, redis_server.url)
                       for profile in profiles(short)]
        finally:
            bench.stop()
    return {"profile": "real-vllm", "model": str(model), "cores": list(cores),
            "shape": {**shape_json(bench.shape, shape.max_staleness),
                      "pool_tokens": bench.shape.max_total_tokens},
            "repeats": repeats, "prefill_tokens_per_s": round(bench.prefill_tokens_per_s),
            "workloads": results, "seconds": round(time.monotonic() - started, 1)}
