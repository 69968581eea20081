"""``queue-rollout demo``: the real stack, both admission modes, side by side.

An embedded Redis, 2 simulated replicas with 8 slots each, one worker per replica
(8 episode workers each), the collector, and a trainer that takes each batch, pauses
the farm (barrier), "trains" for ``TRAIN_S``, raises the policy version and resumes.
The prompt set is the long-tail profile at a small scale: per group of 4, three short
episodes and one long one (its position rotating by prompt). It runs group admission,
then sample refill, and prints a live line, then a summary.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.collector.loop import Collector
from queue_rollout.config import Config
from queue_rollout.launch.up import LocalFarm, wait_for_workers
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import EmbeddedRedis

GROUP, BATCH, PROMPTS, SHORT, LONG = 4, 4, 32, 256, 2048
REPLICAS, SLOTS = 2, 8
TRAIN_S, TRAIN_BATCHES = 1.0, 4


def demo_prompts(n: int = PROMPTS) -> list[dict[str, Any]]:
    return [{"id": f"demo-{i:03d}", "prompt": f"demo prompt {i}",
             "member_lengths": [LONG if m == i % GROUP else SHORT for m in range(GROUP)]}
            for i in range(n)]


def mode_config(base: Config, redis_url: str, mode: str, state_dir: str) -> Config:
    rollout = {"group_size": GROUP, "batch_size": BATCH, "max_staleness": 2,
               "max_concurrent_rollouts": REPLICAS * SLOTS // GROUP}
    if mode == "sample":
        rollout["max_concurrent_samples"] = REPLICAS * SLOTS
    return msgspec.convert({
        "farm": {"name": f"demo-{mode}", "redis_url": redis_url, "state_dir": state_dir},
        "rollout": rollout,
        "engine": {"replicas": REPLICAS, "slots_per_replica": SLOTS,
                   "step_ms": base.engine.step_ms / 4, "step_ms_per_request":
                   base.engine.step_ms_per_request / 4},
        "timeouts": {"shutdown_grace": 2, "pause_barrier": 30},
    }, Config)


@dataclass
class ModeReport:
    mode: str
    accepted: int = 0
    rejected: int = 0
    batches: int = 0
    seconds: float = 0.0
    ready_times: list[float] = field(default_factory=list)
    resumed_times: list[float] = field(default_factory=list)
    active_area: float = 0.0
    generating: float = 0.0

    @property
    def mean_active(self) -> float:
        return self.active_area / self.generating if self.generating else 0.0

    @property
    def mean_interval(self) -> float:
        iv = [self.ready_times[k] - self.resumed_times[k - 1]
              for k in range(1, min(len(self.ready_times), len(self.resumed_times) + 1))]
        return sum(iv) / len(iv) if iv else float("nan")


def run_mode(base: Config, redis_url: str, mode: str, out: TextIO) -> ModeReport:
    with tempfile.TemporaryDirectory(prefix=f"qr-demo-{mode}-") as state:
        config = mode_config(base, redis_url, mode, state)
        farm = LocalFarm(config, Path(state) / "farm.toml")
        farm.start()
        stop = threading.Event()
        report = ModeReport(mode)
        try:
            farm.keep()
            client = RolloutClient(Ledger.from_config(connect(redis_url), config), config)
            collector = Collector(client.ledger, config, name=f"demo-{mode}")
            threading.Thread(target=collector.run, args=(stop, 0.05), daemon=True).start()
            sampler = threading.Thread(target=_sample, args=(client, report, stop, out),
                                       daemon=True)
            wait_for_workers(client.ledger, farm, stop)
            client.submit(demo_prompts())
            t0 = time.monotonic()
            report.seconds = -t0
            sampler.start()
            total_batches = PROMPTS // BATCH
            for k in range(total_batches):
                batch = client.get_batch(timeout=300)
                report.ready_times.append(time.monotonic() - t0)
                client.ack(batch)
                if k < TRAIN_BATCHES:  # a training step: pause, train, new weights, resume
                    client.pause()
                    time.sleep(TRAIN_S)
                    client.set_version(client.version() + 1)
                    client.resume()
                    report.resumed_times.append(time.monotonic() - t0)
                else:  # the drain: consumed without a pause (the budget still grows)
                    client.set_version(client.version() + 1)
                report.batches += 1
            report.seconds += time.monotonic()
            c = client.ledger.counters()
            report.accepted, report.rejected = c.get("accepted", 0), c.get("rejected", 0)
        finally:
            stop.set()
            farm.stop()
        out.write("\n")
        return report


def _sample(client: RolloutClient, report: ModeReport, stop: threading.Event,
            out: TextIO) -> None:
    tty = out.isatty()
    last = time.monotonic()
    shown = 0.0
    while not stop.wait(0.1):
        s = client.status()
        now = time.monotonic()
        if not s["paused"]:
            report.active_area += s["active_episodes"] * (now - last)
            report.generating += now - last
        last = now
        if now - shown < (0.2 if tty else 2.0):
            continue
        shown = now
        g = s["groups"]
        done = g["consumed"]
        bar = "#" * (20 * done // PROMPTS) + "." * (20 - 20 * done // PROMPTS)
        line = (f"{report.mode:>6} [{bar}] {done:>2}/{PROMPTS} groups consumed  slots "
                f"{s['reserved']:>2}/{s['capacity']} reserved, {s['active_episodes']:>2} running  "
                f"groups {g['pending']:>2} pending {g['in_flight']:>2} in flight "
                f"{g['ready']:>2} ready  v{s['version']}{'  paused' if s['paused'] else ''}")
        out.write(("\r" + line) if tty else line + "\n")
        out.flush()


def run_stack_demo(base: Config, out: TextIO = sys.stdout) -> int:
    out.write(f"queue-rollout demo: {PROMPTS} prompts x G={GROUP} ({GROUP - 1} x {SHORT} + "
              f"1 x {LONG} tokens), B={BATCH}, {REPLICAS} simulated replicas x {SLOTS} slots, "
              f"a {TRAIN_S:g} s training pause x {TRAIN_BATCHES}; embedded Redis, workers, "
              "collector: the real stack\n")
    with tempfile.TemporaryDirectory(prefix="qr-demo-") as tmp, \
            EmbeddedRedis(tmp, write_url=False) as redis_server:
        reports = [run_mode(base, redis_server.url, mode, out) for mode in ("group", "sample")]
    g, s = reports
    rows = [
        ("groups accepted", g.accepted, s.accepted, "d"),
        ("groups rejected", g.rejected, s.rejected, "d"),
        ("batches", g.batches, s.batches, "d"),
        ("mean rollout interval (s)", g.mean_interval, s.mean_interval, ".2f"),
        ("all batches delivered (s)", g.seconds, s.seconds, ".2f"),
        ("mean active episodes", g.mean_active, s.mean_active, ".2f"),
        ("slot occupancy", g.mean_active / (REPLICAS * SLOTS),
         s.mean_active / (REPLICAS * SLOTS), ".3f"),
    ]
    out.write(f"\n  {'':<28}{'group admit':>13}{'sample refill':>15}\n")
    for name, a, b, fmt in rows:
        out.write(f"  {name:<28}{format(a, fmt):>13}{format(b, fmt):>15}\n")
    out.write("\n(real processes and wall-clock seconds on this machine; "
              "`queue-rollout demo --virtual` runs the reference shape in virtual time)\n")
    return 0
