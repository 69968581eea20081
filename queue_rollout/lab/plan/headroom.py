"""How far one Redis carries the planned farm.

Redis runs commands on one thread, so its load is a share of one core. The planned
farm's load is the sum of

- **idle**: the collector (``collector_core_pct`` of ``bench --profile redis-load``, once
  per farm; figures from before it was measured apart count it in each GPU's) plus what
  every GPU's worker, episode workers and replica watchers cost with nothing to do
  (``idle_core_pct_per_gpu``) x GPUs;
- **ledger**: the plan's own measurement, Redis CPU per finished episode in the run's
  ledger scripts, x the planned episodes/s;
- **transport**: what the real farm adds per episode beyond its ledger scripts (RQ's
  job, the worker's bookkeeping): redis-load's CPU per episode less its scripts'
  (``EVALSHA``) time, x episodes/s;
- **leases**: each running episode's lease renewals (``lease_core_pct_per_episode``,
  the renewals priced; ``running_core_pct_per_episode``, the running window's, in a
  JSON from before they were priced) x the mean episodes holding a slot.

Connections: redis-load's per GPU x GPUs, against Redis's default ``maxclients``. The
redis-load figures ship with the package (``redis_load.json``, from a 64-GPU
``bench --profile redis-load --json``); ``plan --redis-load FILE`` takes another.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from queue_rollout.errors import BadInput

MAXCLIENTS = 10_000  # Redis's default maxclients
#: The figures a redis-load JSON must carry for a headroom estimate.
NEEDED = ("idle_core_pct_per_gpu", "idle_calls_per_gpu_s", "connections_per_gpu",
          "redis_cpu_ms_per_episode", "running_core_pct_per_episode", "episode_usec")


def load_redis_costs(path: Path | None = None) -> dict[str, Any]:
    """The redis-load figures: *path*, else the ones shipped with the package."""
    try:
        if path is None:
            text = resources.files("queue_rollout.lab.plan").joinpath("redis_load.json").read_text()
        else:
            text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"--redis-load {path}: {exc}") from None
    missing = [k for k in NEEDED if not isinstance(data, dict) or k not in data]
    if missing or not isinstance(data, dict):
        raise BadInput(f"--redis-load {path}: not a `bench --profile redis-load --json` "
                       f"result (no {', '.join(missing)})")
    return data


@dataclass(frozen=True)
class Headroom:
    gpus: int
    episodes_per_s: float
    mean_holding: float  # episodes holding a slot, time-averaged
    idle_pct: float
    ledger_pct: float
    transport_pct: float
    leases_pct: float
    idle_calls_per_s: float
    connections: float

    @property
    def core_pct(self) -> float:
        return self.idle_pct + self.ledger_pct + self.transport_pct + self.leases_pct

    @property
    def headroom(self) -> float:
        return 100.0 / self.core_pct if self.core_pct > 0 else float("inf")

    @property
    def connection_headroom(self) -> float:
        return MAXCLIENTS / self.connections if self.connections else float("inf")

    def as_json(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "episodes_per_s": round(self.episodes_per_s, 2),
                "mean_holding": round(self.mean_holding, 1),
                "idle_core_pct": round(self.idle_pct, 2),
                "ledger_core_pct": round(self.ledger_pct, 2),
                "transport_core_pct": round(self.transport_pct, 2),
                "leases_core_pct": round(self.leases_pct, 2),
                "core_pct": round(self.core_pct, 2), "headroom": round(self.headroom, 2),
                "idle_calls_per_s": round(self.idle_calls_per_s),
                "connections": round(self.connections), "maxclients": MAXCLIENTS,
                "connection_headroom": round(self.connection_headroom, 1)}

    def text(self) -> str:
        return (f"Redis: {self.core_pct:.1f}% of one core at {self.episodes_per_s:,.1f} "
                f"episodes/s (idle {self.idle_pct:.1f}%, ledger {self.ledger_pct:.1f}%, "
                f"transport {self.transport_pct:.1f}%, leases {self.leases_pct:.1f}%): "
                f"headroom x{self.headroom:.2f}; {self.idle_calls_per_s:,.0f} idle calls/s; "
                f"{self.connections:,.0f} connections of {MAXCLIENTS:,} "
                f"(x{self.connection_headroom:.1f})")


def headroom(costs: dict[str, Any], *, gpus: int, episodes_per_s: float,
             mean_holding: float, ledger_cpu_ms_per_episode: float) -> Headroom:
    """The planned farm's Redis load from the run's figures and *costs* (redis-load)."""
    scripts_ms = float(costs["episode_usec"].get("evalsha", 0.0)) / 1000.0
    transport_ms = max(0.0, float(costs["redis_cpu_ms_per_episode"]) - scripts_ms)
    return Headroom(
        gpus=gpus, episodes_per_s=episodes_per_s, mean_holding=mean_holding,
        idle_pct=float(costs.get("collector_core_pct", 0.0))
        + float(costs["idle_core_pct_per_gpu"]) * gpus,
        ledger_pct=ledger_cpu_ms_per_episode * episodes_per_s / 10.0,  # ms/s -> % core
        transport_pct=transport_ms * episodes_per_s / 10.0,
        leases_pct=float(costs.get("lease_core_pct_per_episode",
                                   costs["running_core_pct_per_episode"])) * mean_holding,
        idle_calls_per_s=float(costs.get("collector_calls_per_s", 0.0))
        + float(costs["idle_calls_per_gpu_s"]) * gpus,
        connections=float(costs.get("collector_connections", 0))
        + float(costs["connections_per_gpu"]) * gpus)
