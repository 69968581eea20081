"""``queue-rollout plan --cells``: how many cells a farm needs, by arithmetic.

A farm of cells puts its per-attempt traffic on the cells and its per-group farm-wide
decisions on the control Redis, each server's load a share of one core (Redis runs
commands on one thread). The planned farm (GPUs x slots, every slot busy with episodes
of ``episode_s`` seconds) then costs, in units of one trivial script call:

- **the cells**, all together: the idle GPUs (``idle_units_per_gpu_s`` x GPUs), the
  episodes (``units_per_episode`` x episodes/s: a cell runs a farm of one's scripts,
  admission and judgement included) and the running episodes' leases
  (``lease_units_per_episode_s`` x slots), all from a ``bench --profile redis-load
  --json`` of a farm of one Redis; plus each cell's collector thread
  (``collector_units_per_s`` a cell). As many cells as keep each under ``limit_pct``
  of a quiet core;
- **the control Redis**: per group one reservation, one settlement, and its share of
  what a batch costs there (its pop, the trainer's read of its groups' records, its
  acknowledgement and the check of what the cells are to consume), measured here on a
  private Redis in the same units (its trivial calls measured on it in the same run),
  x groups/s; plus the collector's (``collector_units_per_s``, once: its leader lease
  and ticks).

The workers read the pause flag and the version in their cell, so the idle GPUs' load
is the cells'. What is left out: each cell thread's leader lease renewed once a step
and the trainer's polls for a batch, once a step or a poll rather than once a group
(``bench --profile redis-load --cells 1,2,3`` measures every server of small farms of
cells beside this arithmetic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queue_rollout.errors import BadInput
from queue_rollout.lab.control_cost import measure_control_per_group

#: The figures of a redis-load JSON the arithmetic takes (units: one trivial call).
NEEDED = ("idle_units_per_gpu_s", "units_per_episode", "lease_units_per_episode_s",
          "collector_units_per_s", "quiet_core_units_per_s")
#: The most of a quiet core a server is planned to carry.
LIMIT_PCT = 70.0


@dataclass(frozen=True)
class CellsPlan:
    gpus: int
    slots: int
    episode_s: float
    group_size: int
    batch_size: int
    quiet_core: float  # units/s a quiet core runs
    idle: float  # units/s, over all cells
    episodes: float
    leases: float
    collector: float  # units/s: a cell's collector thread, and the control Redis's share
    control_per_group: float  # units, measured
    limit_pct: float = LIMIT_PCT

    @property
    def episodes_per_s(self) -> float:
        return self.gpus * self.slots / self.episode_s

    @property
    def groups_per_s(self) -> float:
        return self.episodes_per_s / self.group_size

    @property
    def cells_load(self) -> float:
        """Units/s over all cells, their collector threads left out."""
        return self.idle + self.episodes + self.leases

    @property
    def cells(self) -> int:
        """The fewest cells that keep each under the limit."""
        room = self.limit_pct / 100 * self.quiet_core - self.collector
        if room <= 0:
            raise BadInput(f"a cell's collector alone ({self.collector:g} units/s) "
                           f"passes {self.limit_pct:g}% of a quiet core")
        return max(1, math.ceil(self.cells_load / room))

    @property
    def cell_pct(self) -> float:
        return 100 * (self.cells_load / self.cells + self.collector) / self.quiet_core

    @property
    def control_load(self) -> float:
        return self.control_per_group * self.groups_per_s + self.collector

    @property
    def control_pct(self) -> float:
        return 100 * self.control_load / self.quiet_core


def plan_cells(costs: dict[str, Any], control_per_group: float, *, gpus: int, slots: int,
               episode_s: float, group_size: int, batch_size: int,
               limit_pct: float = LIMIT_PCT) -> CellsPlan:
    """The plan for a farm of *gpus* x *slots* with *episode_s* episodes, from a
    redis-load JSON's *costs* and the control Redis's cost per group."""
    missing = [k for k in NEEDED if costs.get(k) is None]
    if missing:
        raise BadInput("plan --cells: the redis-load figures lack "
                       f"{', '.join(missing)} (a `bench --profile redis-load --json` with "
                       "units and priced leases)")
    running = gpus * slots
    return CellsPlan(
        gpus, slots, episode_s, group_size, batch_size,
        quiet_core=costs["quiet_core_units_per_s"],
        idle=costs["idle_units_per_gpu_s"] * gpus,
        episodes=costs["units_per_episode"] * running / episode_s,
        leases=costs["lease_units_per_episode_s"] * running,
        collector=costs["collector_units_per_s"], control_per_group=control_per_group,
        limit_pct=limit_pct)


def cells_text(p: CellsPlan) -> str:
    return "\n".join([
        f"plan --cells: {p.gpus:,} GPUs x {p.slots} slots, {p.episode_s:g} s episodes, "
        f"G {p.group_size}, B {p.batch_size}: {p.episodes_per_s:,.0f} episodes/s, "
        f"{p.groups_per_s:,.0f} groups/s (a quiet core: {p.quiet_core:,.0f} units/s)",
        f"  cells          {p.cells} (each under {p.limit_pct:g}% of a quiet core): "
        f"{p.cell_pct:.1f}% each",
        f"    over all cells: idle {p.idle:,.0f} + episodes {p.episodes:,.0f} + leases "
        f"{p.leases:,.0f} units/s, and {p.collector:,.0f} units/s a cell (its "
        "collector thread)",
        f"  control Redis  {p.control_pct:.1f}% of a quiet core: "
        f"{p.control_per_group:.2f} units a group (reserve, settle; a batch's pop, records "
        f"read and ack shared; measured here) x {p.groups_per_s:,.0f} groups/s + the collector "
        f"{p.collector:,.0f} units/s",
        "  a prediction from a farm of one Redis's figures (bench --profile redis-load "
        "--cells 1,2,3 sets small farms of cells beside it)",
    ])


def cells_json(p: CellsPlan) -> dict[str, Any]:
    return {"gpus": p.gpus, "slots_per_gpu": p.slots, "episode_s": p.episode_s,
            "group_size": p.group_size, "batch_size": p.batch_size,
            "episodes_per_s": round(p.episodes_per_s, 1),
            "groups_per_s": round(p.groups_per_s, 1), "quiet_core_units_per_s": p.quiet_core,
            "cells": p.cells, "cell_core_pct": round(p.cell_pct, 2),
            "cells_units_per_s": {"idle": round(p.idle), "episodes": round(p.episodes),
                                  "leases": round(p.leases),
                                  "collector_each": round(p.collector, 1)},
            "control_units_per_group": round(p.control_per_group, 3),
            "control_core_pct": round(p.control_pct, 2), "limit_pct": p.limit_pct}


def run_cells(*, gpus: int | None, slots: int | None, episode_s: float | None,
              group_size: int | None, batch_size: int | None, redis_load: Path | None,
              as_json: bool) -> str:
    """``plan --cells``: the arithmetic for the flags, as text or one JSON line."""
    import json
    import tempfile

    from queue_rollout.lab.plan.headroom import load_redis_costs

    if gpus is None or slots is None or episode_s is None:
        raise BadInput("plan --cells takes --gpus, --slots-per-replica and --episode-s")
    if episode_s <= 0:
        raise BadInput(f"--episode-s must be > 0, got {episode_s:g}")
    g, b = group_size or 8, batch_size or 16
    costs = load_redis_costs(redis_load)
    with tempfile.TemporaryDirectory(prefix="plan-cells-") as scratch:
        per_group = measure_control_per_group(Path(scratch), group_size=g, batch_size=b)
    p = plan_cells(costs, per_group, gpus=gpus, slots=slots, episode_s=episode_s,
                   group_size=g, batch_size=b)
    return json.dumps(cells_json(p)) if as_json else cells_text(p)
