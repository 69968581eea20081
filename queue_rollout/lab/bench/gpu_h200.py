"""The seed's controlled-length pilots predicted from one H200's step times.

The ideal schedule (the real ledger scripts, the engine model in virtual time, no
control-plane overhead) of the long-tail and equal pilots at the seed's own shape (eight
replicas, B16 x G8 over 128 slots, ``max_staleness`` 2, a 10 s training pause after
each of 6 batches, paused in place, then drain), both admission modes, under two engine
profiles: ``reference-fit`` (the default decode step, fitted to the seed's long-tail
group-admission all-work; the prediction before the GPU profile) and ``h200`` (every
engine constant from the H200 tables, :mod:`queue_rollout.lab.virtual.hardware`; nothing
fitted to a pilot, no time factor); and, for contrast, ``cpu-sglang`` (a real SGLang
on one CPU core, as the real-sglang bench calibrated it): the same shape and work on an
engine whose step grows steeply with running requests. Each profile's change from group admission to
sample refill is set beside the seed's, in percentage points.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from queue_rollout.lab.bench.calibration import REFERENCE
from queue_rollout.lab.bench.pilot import Bench
from queue_rollout.lab.virtual.hardware import CPU_SGLANG, H200
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import PILOTS

#: The engine profiles predicted: the default (fitted to one seed figure) and the H200's.
ENGINES: dict[str, Shape] = {"reference-fit": Shape(), "h200": H200.shape(Shape()),
                             "cpu-sglang": CPU_SGLANG.shape(Shape())}
FIGURES = ("mean_rollout_interval_s", "all_work_completion_s")


def change(group: float, sample: float) -> float:
    """Sample refill's change against group admission, in percent."""
    return round(100.0 * (sample - group) / group, 1)


def run_gpu_h200(redis_url: str, workdir: Path,
                 progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for engine, shape in ENGINES.items():
        bench = Bench(redis_url, shape, Scale(time=1.0, tokens=1.0), workdir / engine)
        for name, seed in REFERENCE.items():
            prompts = PILOTS[name].manifest(shape, bench.scale)
            for mode, (seed_interval, seed_all_work) in seed.items():
                bench.runs += 1
                progress(f"gpu-h200: {engine}, {name}, {mode} admission")
                report = bench.ideal(prompts, mode, shape.max_staleness,
                                     f"gpu-{engine}-{bench.runs}")
                rows.append({"engine": engine, "profile": name, "mode": mode,
                             "mean_rollout_interval_s": round(report.mean_rollout_interval, 2),
                             "all_work_completion_s": round(report.all_work_s, 2),
                             "seed": [seed_interval, seed_all_work],
                             "retractions": report.retractions})
    return {"profile": "gpu-h200", "engines": {
                e: {"step_ms": s.step_ms, "step_ms_per_request": s.step_ms_per_request,
                    "step_us_per_context_token": s.step_us_per_context_token,
                    "prefill_tokens_per_s": s.prefill_tokens_per_s}
                for e, s in ENGINES.items()},
            "runs": rows, "changes": changes(rows)}


def changes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine, pilot and figure: refill's change predicted, the seed's, and the
    difference in percentage points."""
    by = {(r["engine"], r["profile"], r["mode"]): r for r in rows}
    out = []
    for engine in ENGINES:
        for name, seed in REFERENCE.items():
            for k, figure in enumerate(FIGURES):
                predicted = change(by[engine, name, "group"][figure],
                                   by[engine, name, "sample"][figure])
                measured = change(seed["group"][k], seed["sample"][k])
                out.append({"engine": engine, "profile": name, "figure": figure,
                            "predicted_pct": predicted, "seed_pct": measured,
                            "apart_pp": round(predicted - measured, 1)})
    return out


def gpu_h200_text(result: dict[str, Any]) -> str:
    lines = ["bench gpu-h200: the seed's controlled-length pilots, ideal schedules (virtual "
             "time, the seed's shape), each engine profile, beside the seed's figures",
             f"  {'engine':14} {'profile':10} {'mode':7} {'interval':>9} {'seed':>8} "
             f"{'all-work':>9} {'seed':>8}"]
    for r in result["runs"]:
        lines.append(f"  {r['engine']:14} {r['profile']:10} {r['mode']:7} "
                     f"{r['mean_rollout_interval_s']:9.2f} {r['seed'][0]:8.2f} "
                     f"{r['all_work_completion_s']:9.2f} {r['seed'][1]:8.2f}")
    lines.append("  sample refill against group admission, predicted beside the seed's")
    for c in result["changes"]:
        lines.append(f"  {c['engine']:14} {c['profile']:10} {c['figure']:24} "
                     f"{c['predicted_pct']:+7.1f}% {c['seed_pct']:+7.1f}% "
                     f"{c['apart_pp']:+6.1f} pp")
    return "\n".join(lines)
