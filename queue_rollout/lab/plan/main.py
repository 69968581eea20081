"""``queue-rollout plan``: what refill does to a workload, and how far one Redis
carries the farm, before running one.

The workload (a bench profile, or groups sampled from a file of group shapes) runs
once per (mode, max_staleness) in the ideal schedule at the farm's shape; the table
gives each run's figures, the recommendation line the best setting and its cost in
staleness, the headroom line the planned farm's Redis load against one core.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from queue_rollout.errors import BadInput
from queue_rollout.lab.plan.headroom import Headroom, headroom, load_redis_costs
from queue_rollout.lab.plan.report import recommend, table, write_report
from queue_rollout.lab.plan.run import MODES, PLACEMENTS, SLOTS, PlanRun, Setting, run_plan
from queue_rollout.lab.plan.workload import farm_shapes, read_shapes, sample_manifest
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.lab.workloads.registry import pilot_profile

#: Batches a workload file is planned over unless ``--batches`` says otherwise.
FILE_BATCHES = 8


@dataclass(frozen=True)
class PlanArgs:
    profile: str | None = None  # None with no workload: long-tail
    workload: Path | None = None
    #: group shapes a farm recorded (``--from-farm``), and the farm's name
    recorded: tuple[dict[str, Any], ...] | None = None
    farm: str = ""
    gpus: int | None = None  # replicas, one per GPU
    slots_per_replica: int | None = None
    group_size: int | None = None
    batch_size: int | None = None
    batches: int | None = None  # K: K x B prompts, each batch trained on
    train_s: float | None = None  # reference seconds of training after each batch
    max_staleness: tuple[int, ...] = ()  # () : the config's
    modes: tuple[str, ...] = MODES
    placements: tuple[str, ...] = ("any",)  # rollout.placement settings
    slots: tuple[str, ...] = ("fixed",)  # fixed, adaptive (engine.adaptive_slots)
    min_slots_per_replica: int = 1  # adaptive: the workers' lowest limit
    time_scale: float = 1.0
    token_scale: float = 1.0
    seed: int = 0  # which groups a workload file's sample draws
    redis_load: Path | None = None
    json: bool = False
    out: Path | None = None
    command: str = "queue-rollout plan"
    live: bool | None = None  # the progress bars (None: on a terminal)


def plan_shape(base: Shape, args: PlanArgs, *, group_size: int | None = None,
               batches: int | None = None) -> Shape:
    """*base* with the flags' changes; *group_size* and *batches*: the workload's own
    where the flags say nothing."""
    g = args.group_size or group_size or base.group_size
    if group_size is not None and args.group_size not in (None, group_size):
        raise BadInput(f"--group-size {args.group_size}: the workload's groups have "
                       f"{group_size} members")
    changes: dict[str, Any] = {"group_size": g,
                               "min_slots_per_replica": args.min_slots_per_replica}
    for flag, key in (("gpus", "replicas"), ("slots_per_replica", "slots_per_replica"),
                      ("batch_size", "batch_size"), ("train_s", "train_s")):
        if getattr(args, flag) is not None:
            changes[key] = getattr(args, flag)
    shape = dataclasses.replace(base, **changes)
    k = args.batches or batches
    if k is not None:
        shape = dataclasses.replace(shape, prompts=k * shape.batch_size, train_batches=k,
                                    stop_after=None)
    if g > shape.slots:
        raise BadInput(f"a group of {g} members does not fit the farm's {shape.slots} slots "
                       f"({shape.replicas} replicas x {shape.slots_per_replica})")
    return shape


def workload(args: PlanArgs, shape_of: Shape | None = None
             ) -> tuple[str, Shape, Scale, list[dict[str, Any]]]:
    """The workload's name, the shape it runs at, the scale and its prompt manifest."""
    scale = Scale(time=args.time_scale, tokens=args.token_scale)
    if args.workload is not None or args.recorded is not None:
        name, shapes = ((str(args.workload), read_shapes(args.workload))
                        if args.workload is not None else
                        (f"farm {args.farm}", farm_shapes(args.farm, list(args.recorded or ()))))
        shape = plan_shape(shape_of or Shape(), args, group_size=len(shapes[0]["members"]),
                           batches=FILE_BATCHES)
        return name, shape, scale, sample_manifest(shapes, shape.prompts, args.seed, scale)
    profile: Profile = pilot_profile(args.profile or "long-tail")
    shape = plan_shape(shape_of or profile.shape or Shape(), args)
    return profile.name, shape, scale, profile.manifest(shape, scale)


def run(args: PlanArgs, *, default_staleness: int = 2, out: TextIO | None = None) -> int:
    """Plan *args*; the table (or JSON) on *out* (default: stdout as it is when called),
    the setting and progress on stderr."""
    out = out or sys.stdout
    for flag in ("gpus", "slots_per_replica", "group_size", "batch_size", "batches"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise BadInput(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.train_s is not None and args.train_s < 0:
        raise BadInput(f"--train-s must be >= 0, got {args.train_s}")
    if min(args.time_scale, args.token_scale) <= 0:
        raise BadInput("--time-scale and --token-scale must be positive")
    unknown = set(args.modes) - set(MODES)
    if unknown or not args.modes:
        raise BadInput(f"--modes: {', '.join(sorted(unknown)) or 'none given'}; "
                       f"choose from {', '.join(MODES)}")
    if any(s < 0 for s in args.max_staleness):
        raise BadInput("--max-staleness values must be >= 0")
    costs = load_redis_costs(args.redis_load)
    name, shape, scale, prompts = workload(args)
    if not args.placements or set(args.placements) - set(PLACEMENTS):
        raise BadInput(f"--placement: {', '.join(args.placements) or 'none given'}; choose "
                       f"from {', '.join(PLACEMENTS)}")
    if not args.slots or set(args.slots) - set(SLOTS):
        raise BadInput(f"--slots: {', '.join(args.slots) or 'none given'}; choose from "
                       f"{', '.join(SLOTS)}")
    if args.min_slots_per_replica > shape.slots_per_replica:
        raise BadInput(f"engine.min_slots_per_replica {args.min_slots_per_replica} is above "
                       f"the {shape.slots_per_replica} slots per replica planned")
    settings = [Setting(mode, s, placement, slots) for mode in args.modes
                for s in (args.max_staleness or (default_staleness,))
                for placement in args.placements for slots in args.slots]
    print(f"queue-rollout plan: {name}, {len(prompts)} groups of {shape.group_size}, "
          f"B={shape.batch_size}, {shape.replicas} GPUs x {shape.slots_per_replica} slots, "
          f"{shape.train_batches} trained batches ({shape.train_s * scale.time:g} s each); "
          f"time x{scale.time:g}, tokens x{scale.tokens:g}; ideal schedule in virtual time",
          file=sys.stderr)
    runs = run_plan(shape, scale, prompts, settings, live=args.live)
    rooms = [_headroom(r, shape, scale, costs) for r in runs]
    rows = [{**r.as_json(shape), "redis": room.as_json()} for r, room in zip(runs, rooms,
                                                                            strict=True)]
    # the baseline: group admission at the configured window, placing as configured
    groups = [r for r in rows if r["mode"] == "group"] or rows
    groups = [r for r in groups if r["placement"] == args.placements[0]] or groups
    groups = [r for r in groups if r["slots"] == args.slots[0]] or groups
    base = next((r for r in groups if r["max_staleness"] == default_staleness), groups[0])
    best, advice = recommend(rows, base)
    lines = [advice, rooms[rows.index(best)].text()]
    if args.json:
        for row in rows:
            out.write(json.dumps({"workload": name, **row}) + "\n")
        print("\n".join(lines), file=sys.stderr)
    else:
        out.write(table(rows) + "\n\n" + "\n".join(lines) + "\n")
    if args.out is not None:
        path = write_report(args.out, rows, lines, args.command)
        (args.out / "plan.jsonl").write_text(
            "".join(json.dumps({"workload": name, **row}) + "\n" for row in rows))
        print(f"report: {path}", file=sys.stderr)
    return 0


def _headroom(run: PlanRun, shape: Shape, scale: Scale, costs: dict[str, Any]) -> Headroom:
    """The planned farm's Redis load at the rate *run* completes episodes."""
    seconds = run.report.all_work_s / scale.time  # the farm's own seconds
    return headroom(costs, gpus=shape.replicas,
                    episodes_per_s=run.episodes / seconds if seconds > 0 else 0.0,
                    mean_holding=run.report.mean_in_flight,
                    ledger_cpu_ms_per_episode=1000.0 * run.ledger.cpu_s / max(run.episodes, 1))
