"""``queue-rollout demo --virtual``: both admission modes on the long-tail profile.

The real ledger (Lua scripts on an embedded redis-server) with simulated replicas in
virtual time (:mod:`queue_rollout.lab.virtual.farm`), so the reference shape runs in
seconds: the embedded defaults (G=8, B=16, 8 replicas x 16 slots, max_staleness 2, a
10 s training pause per batch for 6 batches, then drain), once with group admission
and once with sample-level refill, and prints what changed.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from typing import TextIO

import msgspec
import redis

from queue_rollout.config import Config, RolloutConfig
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.lab.virtual.farm import EngineModel, SimFarm, SimReport, TrainerSchedule
from queue_rollout.lab.virtual.ideal import rollout_settings
from queue_rollout.lab.virtual.shape import Shape
from queue_rollout.lab.workloads.pilots import LONG_TAIL_LONG, LONG_TAIL_SHORT, long_tail_lengths
from queue_rollout.ledger.connection import connect, connect_config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.progress import LiveView

TRAIN_S = 10.0


def _progress(view: LiveView) -> Callable[[SimFarm], None]:
    def show(farm: SimFarm) -> None:
        running = sum(len(r.running) for r in farm.replicas)
        view.show(farm.done_groups, slots=f"{running}/{farm.slots}",
                  batches=len(farm.ready_times), t=f"{farm.elapsed:.1f}s (sim)")

    return show


def _run_mode(client: redis.Redis, config: Config, rollout: RolloutConfig, farm: str,
              prompts: int, batches: int, label: str) -> SimReport:
    clock = ManualClock()
    ledger = Ledger(client, farm, rollout, clock=clock)
    e = config.engine
    engine = EngineModel(replicas=e.replicas, slots_per_replica=e.slots_per_replica,
                         step_ms=e.step_ms, step_ms_per_request=e.step_ms_per_request)
    sim = SimFarm(ledger, clock, long_tail_lengths(prompts, rollout.group_size),
                  engine=engine,
                  trainer=TrainerSchedule(train_s=TRAIN_S, train_batches=batches),
                  capacity_slots=engine.slots)
    with LiveView(label, prompts, "groups") as view:
        sim.on_progress = _progress(view)
        return sim.run()


def mode_rollout(config: Config, mode: str) -> RolloutConfig:
    """*mode*'s rollout settings on *config*'s farm: its groups, batches, window and
    attempts, every slot of its replicas; group mode admits as many groups at once as
    *config* says."""
    r, e = config.rollout, config.engine
    shape = Shape(group_size=r.group_size, batch_size=r.batch_size, replicas=e.replicas,
                  slots_per_replica=e.slots_per_replica)
    return msgspec.convert({**rollout_settings(shape, mode, r.max_staleness),
                            "max_concurrent_rollouts": r.max_concurrent_rollouts,
                            "max_attempts": r.max_attempts}, RolloutConfig)


def _row(name: str, g: float, s: float, fmt: str) -> str:
    change = f"{(s / g - 1) * 100:+.1f}%" if g else "n/a"
    return f"  {name:<34}{format(g, fmt):>14}{format(s, fmt):>14}{change:>10}"


def summary(group: SimReport, sample: SimReport) -> str:
    lines = [
        f"  {'':<34}{'group admit':>14}{'sample refill':>14}{'change':>10}",
        _row("groups accepted", group.groups_accepted, sample.groups_accepted, ".0f"),
        _row("groups rejected", group.groups_rejected, sample.groups_rejected, ".0f"),
        _row("batches delivered", group.batches, sample.batches, ".0f"),
        _row("mean rollout interval, b2-6 (s)", group.mean_rollout_interval,
             sample.mean_rollout_interval, ".2f"),
        _row("all-work completion (s)", group.all_work_s, sample.all_work_s, ".2f"),
        _row("mean active episodes", group.mean_active, sample.mean_active, ".2f"),
        _row("slot occupancy", group.slot_occupancy, sample.slot_occupancy, ".3f"),
        _row("output tokens", group.output_tokens, sample.output_tokens, ".0f"),
    ]
    return "\n".join(lines)


def run_demo(config: Config, *, prompts: int = 128, batches: int = 6,
             out: TextIO = sys.stdout) -> int:
    r = config.rollout
    group_mode, sample_mode = mode_rollout(config, "group"), mode_rollout(config, "sample")
    out.write(
        f"queue-rollout demo: {prompts} prompts x G={r.group_size} (long tail: "
        f"{r.group_size - 1} x {LONG_TAIL_SHORT:,} + 1 x {LONG_TAIL_LONG:,} tokens), "
        f"B={r.batch_size}, "
        f"{config.engine.replicas} replicas x {config.engine.slots_per_replica} slots, "
        f"max_staleness={r.max_staleness}, {TRAIN_S:g} s training pause x {batches}\n"
        "ledger: Lua scripts on an embedded redis-server; replicas: simulated, virtual time\n")
    with tempfile.TemporaryDirectory(prefix="qr-demo-") as tmp:
        if config.farm.redis_url:
            client = connect_config(config)
            server = None
        else:
            server = EmbeddedRedis(tmp, write_url=False)
            client = connect(server.start())
        try:
            stamp = f"{config.farm.name}-demo-{int(time.time())}"
            group = _run_mode(client, config, group_mode, f"{stamp}-group", prompts, batches,
                              "group admission")
            sample = _run_mode(client, config, sample_mode, f"{stamp}-sample", prompts,
                               batches, "sample refill")
        finally:
            client.close()
            if server is not None:
                server.stop()
    out.write("\n" + summary(group, sample) + "\n")
    out.write("\n(simulated seconds; the same prompts, lengths and timing model in both "
              "modes)\n")
    return 0
