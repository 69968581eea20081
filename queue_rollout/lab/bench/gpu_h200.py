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

Then the seed's workloads (swe-agentic, boba-math and its B8 variant), each at its own
shape and scale, under ``reference-fit`` with the shipped parameters and under ``h200``
with the parameters fitted again, on the H200's constants, to the same group-admission
baseline (``--refit``): group admission is calibrated, sample refill is predicted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from queue_rollout.lab.bench.calibration import REFERENCE
from queue_rollout.lab.bench.pilot import Bench
from queue_rollout.lab.virtual.farm import SimReport
from queue_rollout.lab.virtual.hardware import CPU_SGLANG, H200
from queue_rollout.lab.virtual.ideal import ideal_json
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import PILOTS
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.lab.workloads.seed import (
    BOBA_PARAMS,
    BOBA_PARAMS_H200,
    SWE_PARAMS,
    SWE_PARAMS_H200,
    boba_profile,
    swe_profile,
)

#: The engine profiles predicted: the default (fitted to one seed figure) and the H200's.
ENGINES: dict[str, Shape] = {"reference-fit": Shape(), "h200": H200.shape(Shape()),
                             "cpu-sglang": CPU_SGLANG.shape(Shape())}
FIGURES = ("mean_rollout_interval_s", "all_work_completion_s")

#: The seed's workloads fitted again on the H200's constants by ``--refit``.
REFIT_ON_H200 = ("swe-agentic", "boba-math")
#: Per workload, each figure predicted and the key of the seed's figure beside it
#: (None: the seed did not report it).
WORKLOAD_FIGURES: dict[str, dict[str, str | None]] = {
    "swe-agentic": {"first_batch_s": "first_batch_s", "batches_ready_s": "batches_ready_s",
                    "median_batch_interval_s": "median_batch_interval_s",
                    "steady_groups_per_hour": "accepted_groups_per_hour",
                    "mean_active_episodes": "mean_active_episodes", "gpu_busy": "gpu_busy"},
    "boba-math": {"mean_rollout_interval_s": "mean_rollout_interval_s",
                  "mean_cycle_s": "mean_cycle_s",
                  "steady_groups_per_hour": "accepted_groups_per_hour",
                  "all_work_completion_s": "complete_candidates_s",
                  "mean_active_episodes": None},
    "boba-math-b8": {"mean_rollout_interval_s": "mean_rollout_interval_s",
                     "mean_active_episodes": None},
}
#: The engines the workloads run under (the CPU's has no fit of them).
WORKLOAD_ENGINES = ("reference-fit", "h200")


def change(group: float, sample: float) -> float:
    """Sample refill's change against group admission, in percent."""
    return round(100.0 * (sample - group) / group, 1)


def workload_profile(name: str, engine: str) -> Profile:
    """The seed's workload *name* with the parameters fitted under *engine*."""
    h200 = engine == "h200"
    if name == "swe-agentic":
        return swe_profile(SWE_PARAMS_H200 if h200 else SWE_PARAMS)
    return boba_profile(name, BOBA_PARAMS_H200 if h200 else BOBA_PARAMS)


def run_gpu_h200(redis_url: str, workdir: Path,
                 progress: Callable[[str], None] = lambda line: None,
                 workloads: tuple[str, ...] = tuple(WORKLOAD_FIGURES)) -> dict[str, Any]:
    """The controlled-length pilots under each engine, then *workloads*."""
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
    workload_rows = [row for name in workloads for engine in WORKLOAD_ENGINES
                     for row in run_workload(redis_url, workdir, name, engine, progress)]
    return {"profile": "gpu-h200", "engines": {
                e: {"step_ms": s.step_ms, "step_ms_per_request": s.step_ms_per_request,
                    "step_us_per_context_token": s.step_us_per_context_token,
                    "prefill_tokens_per_s": s.prefill_tokens_per_s}
                for e, s in ENGINES.items()},
            "runs": rows, "changes": changes(rows),
            "workloads": workload_rows, "workload_changes": workload_changes(workload_rows)}


def run_workload(redis_url: str, workdir: Path, name: str, engine: str,
                 progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Both modes' ideal schedules of the seed's workload *name* under *engine*, in
    reference seconds, with the parameters that engine's fit gave."""
    profile = workload_profile(name, engine)
    assert profile.shape is not None and profile.scale is not None
    scale = profile.scale
    shape = profile.shape if engine == "reference-fit" else H200.shape(profile.shape)
    bench = Bench(redis_url, shape, scale, workdir / f"{engine}-{name}")
    prompts = profile.manifest(shape, scale)
    out = []
    for mode in ("group", "sample"):
        progress(f"gpu-h200: {engine}, {name}, {mode} admission")
        report = bench.ideal(prompts, mode, shape.max_staleness, f"gpu-{engine}-{name}")
        out.append({"engine": engine, "profile": name, "mode": mode,
                    **reference_figures(report, shape, scale, profile.turns is not None)})
    return out


def reference_figures(report: SimReport, shape: Shape, scale: Scale, multi_turn: bool
                      ) -> dict[str, float | None]:
    """An ideal schedule's figures in the reference's seconds."""
    figures = ideal_json(report, shape, multi_turn)
    out: dict[str, float | None] = {}
    for key, value in figures.items():
        if value is not None and key.endswith("_s"):
            value = round(value / scale.time, 2)
        elif value is not None and key == "steady_groups_per_hour":
            value = round(value * scale.time, 2)
        out[key] = value
    return out


def workload_changes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per engine, workload and figure: refill's change predicted, the seed's where it
    reported one, and the difference in percentage points."""
    by = {(r["engine"], r["profile"], r["mode"]): r for r in rows}
    out = []
    for engine, name in dict.fromkeys((r["engine"], r["profile"]) for r in rows):
        seed = workload_profile(name, engine).seed or {}
        for figure, seed_key in WORKLOAD_FIGURES[name].items():
            group, sample = by[engine, name, "group"][figure], by[engine, name, "sample"][figure]
            predicted = None if group is None or sample is None else change(group, sample)
            seeds = [seed.get(mode, {}).get(seed_key) for mode in ("group", "sample")]
            if seed_key is None:
                measured = None
            elif None not in seeds:
                measured = change(seeds[0], seeds[1])
            else:
                share = seed.get("change", {}).get(seed_key)
                measured = None if share is None else round(100.0 * share, 1)
            out.append({"engine": engine, "profile": name, "figure": figure,
                        "group": group, "sample": sample, "seed": seeds,
                        "predicted_pct": predicted, "seed_pct": measured,
                        "apart_pp": None if predicted is None or measured is None
                        else round(predicted - measured, 1)})
    return out


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
    if result["workload_changes"]:
        lines.append("  the seed's workloads (reference seconds): group, sample, refill's "
                     "change; the seed's group, sample, change; apart")
    for c in result["workload_changes"]:
        seed_group, seed_sample = (_fmt(v, "10.2f") for v in c["seed"])
        lines.append(f"  {c['engine']:14} {c['profile']:13} {c['figure']:24} "
                     f"{_fmt(c['group'], '10.2f')} {_fmt(c['sample'], '10.2f')} "
                     f"{_fmt(c['predicted_pct'], '+7.1f', '%')} {seed_group} {seed_sample} "
                     f"{_fmt(c['seed_pct'], '+7.1f', '%')} {_fmt(c['apart_pp'], '+6.1f', ' pp')}")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    """*value* as *spec* and *unit*; a dash as wide where there is none."""
    width = int(spec.lstrip("+").split(".")[0]) + len(unit)
    return f"{'-':>{width}}" if value is None else format(value, spec) + unit
