"""The control Redis's cost per group of a farm of cells, measured on a private Redis in
units of one trivial call measured on the same server: what ``plan --cells`` prices the
control Redis with, and what ``bench --profile redis-load --cells`` predicts it by."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from queue_rollout.config import RolloutConfig
from queue_rollout.errors import InvariantViolation
from queue_rollout.lab.redis_info import read, trivial_calls
from queue_rollout.ledger import cells
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import EmbeddedRedis


def measure_control_per_group(workdir: Path, *, groups: int = 2000, group_size: int = 8,
                              batch_size: int = 16, rounds: int = 3,
                              gap_s: float = 0.0) -> float:
    """Redis's cost on the control Redis of one group, in units of one trivial call
    measured on the same server: a reservation, a settlement (accepted), and its share
    of a batch's calls (its pop, the trainer's read of its groups' records, the
    acknowledgement with its check of what the cells consume: :func:`cells.ack` with no
    cell), one call at a time on one connection; the median of *rounds*. With *gap_s*,
    a pause that long after each reservation and settlement: the same calls arriving
    at a lower rate (the server's idle rate subtracted)."""
    rollout = RolloutConfig(group_size=group_size, batch_size=batch_size,
                            max_staleness=groups * rounds, max_concurrent_samples="auto")
    per_group = []
    with EmbeddedRedis(workdir, write_url=False) as server:
        client, meter = connect(server.url), connect(server.url)
        try:
            control = Ledger(client, "plan-cells", rollout)
            for r in range(rounds):
                unit = trivial_calls(meter)
                a = read(meter)
                for i in range(groups):
                    gid = f"r{r}-g{i}"
                    control.reserve(gid, "a")
                    time.sleep(gap_s)
                    control.settle(gid, accept=True)
                    time.sleep(gap_s)
                    if (i + 1) % batch_size == 0:
                        delivery = control.pop_batch("trainer")
                        if delivery is None:
                            raise InvariantViolation("the control Redis's cost: B "
                                                     "settled groups made no batch")
                        batch = delivery.batch
                        control.groups(batch.groups)  # the trainer finds each one's cell
                        cells.ack(control, {}, "trainer", batch.id, batch.groups)
                b = read(meter)
                spent = b.cpu_s - a.cpu_s
                if gap_s:  # the server's own timers over that time, from a second idle
                    time.sleep(1.0)
                    c = read(meter)
                    spent -= (c.cpu_s - b.cpu_s) / (c.at - b.at) * (b.at - a.at)
                unit_cpu = unit.cpu_s / sum(unit.calls.values())
                per_group.append(spent / groups / unit_cpu)
        finally:
            client.close()
            meter.close()
    return statistics.median(per_group)
