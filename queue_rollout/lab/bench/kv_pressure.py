"""The kv-pressure pilot's runs (its profile: ``KV_PRESSURE``, in
:mod:`queue_rollout.lab.workloads.pilots`): fixed episode slots against adaptive
concurrency when the replicas' KV memory is short.

The long tail's episodes (seven 1,024-token members and one 16,384-token one per
group) over replicas whose KV pool holds 8 x 16,384 reference tokens
(``max_total_tokens`` 131,072, against 220,000 for the other pilots): sixteen slots
can hold more long episodes than the pool fits, and a replica then retracts requests
and computes their context again. The staleness window is 7 (eight batches of the 128
groups in flight): under the reference's 3-batch window the slots hold about half as
many episodes and the pool never fills, so nothing would press on it. Both admission
modes run with 16 fixed slots per replica and with ``engine.adaptive_slots`` (floor
1), through the real stack (audited) beside the ideal schedule of each; sample mode
with adaptive slots has ``"auto"`` capacity, so admission follows the limits.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.bench.pilot import Bench, run_audited
from queue_rollout.lab.bench.results import changes, mode_json, shape_json
from queue_rollout.lab.sim.model import recomputed_tokens
from queue_rollout.lab.virtual.farm import SimReport
from queue_rollout.lab.virtual.ideal import ideal_schedule
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import PILOTS
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.ledger.connection import connect

#: The runs, in order: (admission mode, slots).
RUNS = (("group", "fixed"), ("group", "adaptive"), ("sample", "fixed"),
        ("sample", "adaptive"))


def kv_figures(*, retractions: int, recomputed: int, output_tokens: int, all_work_s: float
               ) -> dict[str, float | int | None]:
    """Retractions, context tokens computed again, output tokens per second of all-work."""
    return {"retractions": retractions, "recomputed_prefill_tokens": recomputed,
            "tokens_per_s": round(output_tokens / all_work_s, 1) if all_work_s > 0 else None}


def ideal_figures(ideal: SimReport) -> dict[str, Any]:
    return {**kv_figures(retractions=ideal.retractions, recomputed=ideal.recomputed_tokens,
                         output_tokens=ideal.output_tokens, all_work_s=ideal.all_work_s),
            "mean_slots_limit": round(ideal.mean_slots_limit, 1),
            "limit_changes": ideal.limit_changes}


def run_json(run: ModeRun, shape: Shape, scale: Scale) -> dict[str, Any]:
    """One run's figures: its mode's, the replicas' retractions and recomputation (their
    request logs), and the same for its ideal schedule."""
    out = mode_json(run, scale, shape, multi_turn=False)
    out.update(kv_figures(retractions=sum(e["retractions"] for e in run.requests),
                          recomputed=recomputed_tokens(run.requests),
                          output_tokens=run.output_tokens, all_work_s=run.all_work_s))
    if run.redis is not None:  # what the farm cost its Redis: the limits' registry writes too
        episodes = max(run.counters.get("finished", 0), 1)
        out["redis_commands_per_episode"] = round(sum(run.redis.calls.values()) / episodes, 2)
        out["redis_cpu_ms_per_episode"] = round(1000.0 * run.redis.cpu_s / episodes, 4)
    if run.ideal is not None:
        out["ideal"].update(ideal_figures(run.ideal))
    return out


def kv_pressure_json(profile: Profile, shape: Shape, scale: Scale, max_staleness: int,
                     runs: dict[str, ModeRun]) -> dict[str, Any]:
    by_run = {key: run_json(run, shape, scale) for key, run in runs.items()}
    out: dict[str, Any] = {
        "profile": profile.name, "scale": scale.as_json(),
        "shape": {**shape_json(shape, max_staleness),
                  "max_total_tokens": scale.length(shape.max_total_tokens),
                  "min_slots_per_replica": shape.min_slots_per_replica},
        "runs": by_run,
        # adaptive against fixed slots, per admission mode
        "change": {}, "ideal_change": {}}
    for mode in ("group", "sample"):
        fixed, adaptive = by_run[f"{mode}/fixed"], by_run[f"{mode}/adaptive"]
        out["change"][mode] = {**changes(fixed, adaptive), **_kv_changes(fixed, adaptive)}
        out["ideal_change"][mode] = {**changes(fixed["ideal"], adaptive["ideal"]),
                                     **_kv_changes(fixed["ideal"], adaptive["ideal"])}
    return out


def _kv_changes(fixed: dict[str, Any], adaptive: dict[str, Any]) -> dict[str, float | None]:
    """adaptive / fixed - 1 for retractions, recomputation and tokens/s (None where fixed
    had none: no change can be told as a share of nothing)."""
    return {k: round(adaptive[k] / fixed[k] - 1, 4) if fixed.get(k) and adaptive.get(k)
            is not None else None
            for k in ("retractions", "recomputed_prefill_tokens", "tokens_per_s")}


def controls(redis_url: str, scale: Scale) -> dict[str, Any]:
    """Adaptive slots where memory is not short: the ideal schedules of the long-tail
    and equal pilots at the reference shape (the shipped pool), each mode with fixed
    and adaptive slots; all-work and its change."""
    client = connect(redis_url)
    out: dict[str, Any] = {}
    try:
        for name in ("long-tail", "equal"):
            shape = Shape()
            prompts = PILOTS[name].manifest(shape, scale)
            for mode in ("group", "sample"):
                reports = {slots: ideal_schedule(
                    client, shape, scale, prompts, mode, shape.max_staleness,
                    f"kv-control-{name}-{mode}-{slots}-{uuid.uuid4().hex[:8]}",
                    adaptive=slots == "adaptive") for slots in ("fixed", "adaptive")}
                fixed, adaptive = reports["fixed"].all_work_s, reports["adaptive"].all_work_s
                out[f"{name}/{mode}"] = {
                    "fixed_all_work_s": round(fixed, 3), "adaptive_all_work_s": round(adaptive, 3),
                    "change": round(adaptive / fixed - 1, 4),
                    "retractions": [reports["fixed"].retractions,
                                    reports["adaptive"].retractions],
                    "limit_changes": reports["adaptive"].limit_changes}
    finally:
        client.close()
    return out


#: A pool no run fills: what the same schedule takes when memory is never short.
UNLIMITED_POOL = 10**9


def unlimited_pool(redis_url: str, shape: Shape, scale: Scale, profile: Profile,
                   max_staleness: int) -> dict[str, Any]:
    """The most any controller could save: each mode's ideal schedule with fixed slots
    and a pool no run fills; all-work and retractions (none)."""
    unlimited = dataclasses.replace(shape, max_total_tokens=UNLIMITED_POOL)
    prompts = profile.manifest(unlimited, scale)
    client = connect(redis_url)
    try:
        reports = {mode: ideal_schedule(client, unlimited, scale, prompts, mode,
                                        max_staleness,
                                        f"kv-unlimited-{mode}-{uuid.uuid4().hex[:8]}")
                   for mode in ("group", "sample")}
    finally:
        client.close()
    return {mode: {"all_work_completion_s": round(r.all_work_s, 3),
                   "retractions": r.retractions} for mode, r in reports.items()}


def run_kv_pressure(bench: Bench, profile: Profile, max_staleness: int
                    ) -> tuple[dict[str, Any], dict[str, ModeRun]]:
    """Both modes with fixed and adaptive slots over one manifest, audited
    (:func:`~.pilot.run_audited`); the same schedules with a pool no run fills
    (:func:`unlimited_pool`); and the long-tail and equal controls (:func:`controls`)."""
    runs = run_audited(bench, profile, max_staleness,
                       {f"{mode}/{slots}": {"mode": mode, "adaptive": slots == "adaptive"}
                        for mode, slots in RUNS})
    result = kv_pressure_json(profile, bench.shape, bench.scale, max_staleness, runs)
    result["unlimited_pool"] = unlimited_pool(bench.redis_url, bench.shape, bench.scale,
                                              profile, max_staleness)
    result["controls"] = controls(bench.redis_url, bench.scale)
    return result, runs
