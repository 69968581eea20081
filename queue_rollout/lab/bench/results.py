"""A pilot's figures as the bench's JSON: each mode's, their ideal schedules', and the
change from group admission to sample refill."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from queue_rollout.lab.bench.measures import ModeRun
from queue_rollout.lab.virtual.figures import num, schedule_figures
from queue_rollout.lab.virtual.ideal import ideal_json
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.profile import Profile


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

