"""The runs of a plan: one ideal schedule per setting on a private Redis.

Each (mode, max_staleness) runs the bench's ideal schedule
(:func:`~queue_rollout.lab.virtual.ideal.ideal_schedule`): the ledger's real scripts on a
private embedded redis-server, its clock set to virtual time, and the engine model. The
run's own ledger cost is read from that Redis (``INFO commandstats`` and ``INFO cpu``
before and after), so it counts the scripts' commands and Redis's CPU per episode,
nothing else. The staleness of each consumed group is the ledger's own observation
(policy version at acknowledgement less the version it was admitted under).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from queue_rollout.lab.redis_info import Window, read
from queue_rollout.lab.virtual.farm import SimFarm, SimReport
from queue_rollout.lab.virtual.ideal import ideal_json, ideal_schedule
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.keys import Keys
from queue_rollout.progress import LiveView

MODES = ("group", "sample")
PLACEMENTS = ("any", "group")
SLOTS = ("fixed", "adaptive")


@dataclass(frozen=True)
class Setting:
    mode: str
    max_staleness: int
    placement: str = "any"  # rollout.placement
    slots: str = "fixed"  # fixed, adaptive (engine.adaptive_slots)

    @property
    def label(self) -> str:
        placed = ", groups placed on one replica" if self.placement == "group" else ""
        adaptive = ", adaptive slots" if self.slots == "adaptive" else ""
        return f"{self.mode} admission, max_staleness {self.max_staleness}{placed}{adaptive}"


@dataclass
class PlanRun:
    """One setting's ideal schedule and what it cost the ledger."""

    setting: Setting
    report: SimReport
    multi_turn: bool
    staleness: list[int]  # each consumed group's, in versions
    ledger: Window  # the Redis's own counters over the run
    episodes: int  # episodes that finished
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_staleness(self) -> float | None:
        return sum(self.staleness) / len(self.staleness) if self.staleness else None

    def as_json(self, shape: Shape) -> dict[str, Any]:
        """The bench's ideal-schedule figures, then the plan's own."""
        figures = ideal_json(self.report, shape, self.multi_turn)
        per = max(self.episodes, 1)
        groups = max(self.report.groups_accepted + self.report.groups_rejected, 1)
        prefill = self.report.prefill_tokens + self.report.cached_tokens
        mean = self.mean_staleness
        return {
            "mode": self.setting.mode, "max_staleness": self.setting.max_staleness,
            "placement": self.setting.placement, "slots": self.setting.slots,
            **figures,
            "mean_slots_limit": round(self.report.mean_slots_limit, 1),
            "prefill_tokens_per_group": round(self.report.prefill_tokens / groups, 1),
            "cache_hit_rate": (round(self.report.cached_tokens / prefill, 4) if prefill
                               else None),
            "accepted_groups_per_hour": figures["steady_groups_per_hour"],
            "groups_accepted": self.report.groups_accepted,
            "batches": self.report.batches,
            "mean_consumed_staleness": None if mean is None else round(mean, 3),
            "max_consumed_staleness": max(self.staleness) if self.staleness else None,
            "episodes": self.episodes,
            "ledger_commands_per_episode": round(sum(self.ledger.calls.values()) / per, 2),
            "ledger_cpu_ms_per_episode": round(1000.0 * self.ledger.cpu_s / per, 4),
            "wall_s": round(self.wall_s, 2),
        }


class ObservationTap:
    """Reads a farm's observations stream as it grows (it is capped, so a long run is
    read while it runs) and keeps the consumed groups' staleness."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key
        self.staleness: list[int] = []
        self._last = "0-0"

    def poll(self) -> None:
        while True:
            entries = self.client.xrange(self.key, min=f"({self._last}", count=10_000)
            if not entries:
                return
            for _, fields in entries:
                if fields.get(b"k") == b"staleness":
                    self.staleness.append(round(float(fields[b"v"])))
            self._last = entries[-1][0].decode()


def total_groups(shape: Shape) -> int:
    """Groups a run completes: every prompt, or the batches it stops after."""
    if shape.stop_after is not None:
        return min(shape.prompts, shape.stop_after * shape.batch_size)
    return shape.prompts


def run_setting(client: redis.Redis, shape: Shape, scale: Scale,
                prompts: list[dict[str, Any]], setting: Setting, *,
                show: Callable[[SimFarm], None] | None = None) -> PlanRun:
    """One setting's ideal schedule on *client* (a farm name of its own, deleted
    after), measured."""
    farm = (f"plan-{setting.mode}-{setting.max_staleness}-{setting.placement}-"
            f"{setting.slots}-{uuid.uuid4().hex[:8]}")
    tap = ObservationTap(client, Keys(farm).observations)
    polled_at = [time.monotonic()]

    def progress(sim: SimFarm) -> None:
        if show is not None:
            show(sim)
        if time.monotonic() - polled_at[0] > 2.0:
            polled_at[0] = time.monotonic()
            tap.poll()

    started, before = time.monotonic(), read(client)
    report = ideal_schedule(client, shape, scale, prompts, setting.mode,
                            setting.max_staleness, farm, placement=setting.placement,
                            adaptive=setting.slots == "adaptive", on_progress=progress)
    after = read(client)
    tap.poll()
    episodes = int(client.hget(Keys(farm).counters, "finished") or 0)
    _drop_farm(client, farm)
    return PlanRun(setting, report, "member_turns" in prompts[0], tap.staleness,
                   Window.between(before, after), episodes,
                   wall_s=time.monotonic() - started)


def _drop_farm(client: redis.Redis, farm: str) -> None:
    """Delete a finished run's keys: the private Redis holds one run at a time."""
    for key in client.scan_iter(match=f"{Keys(farm).prefix}*", count=1000):
        client.unlink(key)


def run_plan(shape: Shape, scale: Scale, prompts: list[dict[str, Any]],
             settings: list[Setting], *, live: bool | None = None) -> list[PlanRun]:
    """Every setting in turn on one private redis-server, a progress bar each."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="qr-plan-") as tmp:
        server = EmbeddedRedis(tmp, write_url=False)
        client = connect(server.start())
        try:
            groups = total_groups(shape)
            for setting in settings:
                with LiveView(setting.label, groups, "groups", enabled=live) as view:
                    def show(sim: SimFarm, view: LiveView = view) -> None:
                        view.show(sim.done_groups, batches=len(sim.ready_times),
                                  t=f"{sim.elapsed:,.0f}s (sim)")

                    runs.append(run_setting(client, shape, scale, prompts, setting,
                                            show=show))
        finally:
            client.close()
            server.stop()
    return runs
