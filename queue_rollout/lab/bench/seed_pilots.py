"""The seed's workload pilots (:mod:`queue_rollout.lab.workloads.seed`): their
calibration, fitting the free parameters so that *group admission*'s ideal schedule
lands on the seed's baseline (``--refit``), what a run's ideal schedule achieves against
those targets, and how much the prediction leans on each documented choice
(``--sensitivity``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from queue_rollout.lab.bench.audit import manifest_turns
from queue_rollout.lab.bench.fit import Fit, fit
from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import Bench
from queue_rollout.lab.bench.results import changes
from queue_rollout.lab.virtual.farm import SimReport
from queue_rollout.lab.virtual.figures import schedule_figures
from queue_rollout.lab.virtual.hardware import H200, EngineProfile
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.lab.workloads.seed import (
    BOBA_B8_SHAPE,
    BOBA_FITTED,
    BOBA_PARAMS,
    BOBA_PARAMS_H200,
    BOBA_SHAPE,
    BOBA_TARGETS,
    SWE_FITTED,
    SWE_PARAMS,
    SWE_PARAMS_H200,
    SWE_SHAPE,
    SWE_TARGETS,
    boba_profile,
    swe_profile,
)

# -- calibration --------------------------------------------------------------------------

def baseline_figures(report: SimReport, prompts: list[dict[str, Any]], shape: Shape,
                     scale: Scale) -> dict[str, float]:
    """An ideal schedule's figures in reference units, as the calibration compares them
    with the seed's baseline."""
    members = [sum(turns) for p in prompts for turns in manifest_turns(p)]
    return {"first_batch_s": report.ready_times[0] / scale.time,
            "accepted_groups_per_hour": report.steady_groups_per_hour(shape.batch_size)
            * scale.time,
            "mean_active_episodes": report.mean_in_flight, "gpu_busy": report.gpu_busy,
            "mean_rollout_interval_s": report.mean_rollout_interval / scale.time,
            "mean_output_tokens": sum(members) / len(members) / scale.tokens}


def refit(name: str, redis_url: str, workdir: Path, progress: Callable[[str], None],
          engine: EngineProfile | None = None) -> dict[str, Any]:
    """Fit *name*'s free parameters to the seed's baseline, starting from the shipped
    ones (for *engine*'s constants, or the default engine model's); the fitted values,
    the figures they give and the targets, as JSON."""
    if name == "swe-agentic":
        names, targets = SWE_FITTED, SWE_TARGETS
        swe_start = SWE_PARAMS_H200 if engine is H200 else SWE_PARAMS
        start: Any = swe_start

        def make(values: Mapping[str, float]) -> Profile:
            return swe_profile(dataclasses.replace(swe_start, **_any(values)), calibration={})
    elif name == "boba-math":
        names, targets = BOBA_FITTED, BOBA_TARGETS  # type: ignore[assignment]
        boba_start = BOBA_PARAMS_H200 if engine is H200 else BOBA_PARAMS
        start = boba_start

        def make(values: Mapping[str, float]) -> Profile:
            return boba_profile(params=dataclasses.replace(boba_start, **_any(values)),
                                calibration={})
    else:
        raise ValueError(f"{name} has no calibration to refit")
    probe = make({})
    assert probe.shape is not None and probe.scale is not None
    shape = probe.shape if engine is None else engine.shape(probe.shape)
    bench = Bench(redis_url, shape, probe.scale, workdir, progress)

    def evaluate(values: Mapping[str, float]) -> dict[str, float]:
        profile = make(values)
        prompts = profile.manifest(bench.shape, bench.scale)
        report = bench.ideal(prompts, "group", bench.shape.max_staleness, "calibrate")
        figures = baseline_figures(report, prompts, bench.shape, bench.scale)
        progress("  " + json.dumps({k: round(v, 4) for k, v in values.items()}) + " -> "
                 + json.dumps({k: round(figures[k], 4) for k in targets}))
        return figures

    result: Fit = fit(evaluate, {k: float(getattr(start, k)) for k in names}, targets,
                      progress=progress)
    return {"profile": name, "engine": "default" if engine is None else engine.name,
            "fitted": result.params,
            "figures": {k: result.figures[k] for k in targets}, "targets": dict(targets),
            "worst_error": round(result.worst_error, 4), "evaluations": result.evaluations}


def calibration_achieved(result: dict[str, Any], group: ModeRun, profile: Profile,
                         shape: Shape, scale: Scale) -> None:
    """Adds to *result*'s calibration block what this run's group ideal schedule gives
    for each target, and the worst relative error."""
    calibration = result.setdefault("calibration", {})
    targets: Mapping[str, float] = calibration.get("targets", {})
    if group.ideal is None or not targets:
        return
    figures = baseline_figures(group.ideal, profile.manifest(shape, scale), shape, scale)
    calibration["achieved"] = {k: round(figures[k], 4) for k in targets}
    calibration["worst_error"] = round(max(abs(figures[k] / v - 1)
                                           for k, v in targets.items()), 4)


def _any(values: Mapping[str, float]) -> dict[str, Any]:
    return dict(values)


# -- sensitivity ---------------------------------------------------------------------------

def _variants(name: str) -> list[tuple[str, Profile, Shape]]:
    """(choice, profile, shape): one documented choice changed at a time."""
    if name == "swe-agentic":
        base, p = SWE_SHAPE, SWE_PARAMS
        return [
            ("KV pool 440,000 tokens (a 96 GB card)",
             swe_profile(), dataclasses.replace(base, max_total_tokens=440_000)),
            ("KV pool 330,000 tokens", swe_profile(),
             dataclasses.replace(base, max_total_tokens=330_000)),
            ("prompt 4,096 tokens", dataclasses.replace(swe_profile(), prompt_tokens=4096),
             base),
            ("tool output halved (median 250 tokens)",
             swe_profile(dataclasses.replace(p, tool_tokens_median=p.tool_tokens_median / 2)),
             base),
            ("no harness failures", swe_profile(dataclasses.replace(p, harness_share=0.0)),
             base),
        ]
    shape = BOBA_B8_SHAPE if name == "boba-math-b8" else BOBA_SHAPE
    return [
        ("groups alike (difficulty sigma 0.1)",
         boba_profile(name, dataclasses.replace(BOBA_PARAMS, difficulty_sigma=0.1)), shape),
        ("groups differ more (difficulty sigma 0.5)",
         boba_profile(name, dataclasses.replace(BOBA_PARAMS, difficulty_sigma=0.5)), shape),
        ("KV pool 110,000 tokens", boba_profile(name),
         dataclasses.replace(shape, max_total_tokens=110_000)),
        ("KV pool 440,000 tokens", boba_profile(name),
         dataclasses.replace(shape, max_total_tokens=440_000)),
    ]


SENSITIVE = ("first_batch_s", "steady_groups_per_hour", "mean_active_episodes",
             "mean_rollout_interval_s", "all_work_completion_s")


def sensitivity(name: str, redis_url: str, scale: Scale, max_staleness: int,
                workdir: Path, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """Both modes' ideal schedules with one choice changed at a time, in reference units:
    how much the prediction leans on each choice."""
    out = []
    for choice, profile, shape in _variants(name):
        shape = dataclasses.replace(shape, max_staleness=max_staleness)
        bench = Bench(redis_url, shape, scale, workdir, progress)
        prompts = profile.manifest(shape, scale)
        row: dict[str, Any] = {"choice": choice}
        for mode in ("group", "sample"):
            report = bench.ideal(prompts, mode, max_staleness, f"sensitivity-{mode}")
            figures = schedule_figures(report.ready_times, report.pause_ends,
                                       shape.batch_size, shape.train_batches)
            active = report.mean_in_flight if profile.turns else report.mean_active
            row[mode] = {"first_batch_s": _ref(figures["first_batch_s"], scale),
                         "steady_groups_per_hour": None if figures[
                             "steady_groups_per_hour"] is None else round(
                             figures["steady_groups_per_hour"] * scale.time, 2),
                         "mean_active_episodes": round(active, 2),
                         "mean_rollout_interval_s": _ref(report.mean_rollout_interval, scale),
                         "all_work_completion_s": _ref(report.all_work_s, scale)}
        row["change"] = changes(row["group"], row["sample"])
        progress(f"{name} sensitivity: {choice}: " + json.dumps(row["change"]))
        out.append(row)
    return out


def _ref(seconds: float | None, scale: Scale) -> float | None:
    return None if seconds is None or seconds != seconds else round(seconds / scale.time, 2)
