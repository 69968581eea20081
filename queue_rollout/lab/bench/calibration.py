"""The engine model against the reference's controlled-length figures.

The ideal schedule (the real ledger scripts, the engine model in virtual time, no
control-plane overhead) of the long-tail and equal pilots at the reference scale (no
time or token scaling), both admission modes, under each pause mode. The decode
constants were calibrated on one figure only, long-tail group-admission all-work; every
other figure here is a prediction, set beside what the reference measured.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from queue_rollout.config import PauseMode
from queue_rollout.lab.bench.pilot import Bench
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import PILOTS

#: The reference's figures (s): mean rollout interval, all-work completion.
REFERENCE: dict[str, dict[str, tuple[float, float]]] = {
    "long-tail": {"group": (73.99, 733.13), "sample": (26.12, 453.93)},
    "equal": {"group": (21.82, 315.95), "sample": (21.86, 316.22)},
}
PAUSE_MODES: tuple[PauseMode, ...] = ("in_place", "abort", "retract")


def run_calibration(redis_url: str, workdir: Path,
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    shape = Shape()
    bench = Bench(redis_url, shape, Scale(time=1.0, tokens=1.0), workdir)
    rows: list[dict[str, Any]] = []
    for name, reference in REFERENCE.items():
        prompts = PILOTS[name].manifest(shape, bench.scale)
        for pause_mode in PAUSE_MODES:
            for mode, (ref_interval, ref_all_work) in reference.items():
                bench.runs += 1
                progress(f"calibration: {name}, {mode} admission, pause {pause_mode}")
                report = bench.ideal(prompts, mode, shape.max_staleness,
                                     f"calibration-{bench.runs}", pause_mode=pause_mode)
                rows.append({
                    "profile": name, "mode": mode, "pause_mode": pause_mode,
                    "mean_rollout_interval_s": round(report.mean_rollout_interval, 2),
                    "all_work_completion_s": round(report.all_work_s, 2),
                    "reference_interval_s": ref_interval,
                    "reference_all_work_s": ref_all_work,
                    "retractions": report.retractions,
                    "prefill_tokens": report.prefill_tokens,
                })
    return {"profile": "calibration", "runs": rows, "best_pause_mode": best_pause_mode(rows)}


def relative_error(row: dict[str, Any]) -> float:
    """Mean absolute relative error of a run's interval and all-work."""
    interval = float(row["mean_rollout_interval_s"]) / float(row["reference_interval_s"])
    all_work = float(row["all_work_completion_s"]) / float(row["reference_all_work_s"])
    return (abs(interval - 1) + abs(all_work - 1)) / 2


def best_pause_mode(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per profile, the pause mode whose figures are closest to the reference's."""
    best: dict[str, str] = {}
    for name in REFERENCE:
        errors = {mode: sum(relative_error(r) for r in rows
                            if r["profile"] == name and r["pause_mode"] == mode)
                  for mode in PAUSE_MODES}
        best[name] = min(errors, key=lambda m: errors[m])
    return best


def calibration_text(result: dict[str, Any]) -> str:
    lines = ["bench calibration: the engine model's ideal schedule (virtual time, reference "
             "scale) against the reference's figures",
             f"  {'profile':10} {'mode':7} {'pause':9} {'interval':>9} {'ref.':>8} "
             f"{'all-work':>9} {'ref.':>8} {'retracted':>9} {'prefilled':>10}"]
    for r in result["runs"]:
        lines.append(
            f"  {r['profile']:10} {r['mode']:7} {r['pause_mode']:9} "
            f"{r['mean_rollout_interval_s']:9.2f} {r['reference_interval_s']:8.2f} "
            f"{r['all_work_completion_s']:9.2f} {r['reference_all_work_s']:8.2f} "
            f"{r['retractions']:9d} {r['prefill_tokens']:10,d}")
    lines.append("  closest to the reference: " + ", ".join(
        f"{name} {mode}" for name, mode in result["best_pause_mode"].items()))
    return "\n".join(lines)
