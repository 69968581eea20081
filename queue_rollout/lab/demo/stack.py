"""``queue-rollout demo``: the real stack, both admission modes, side by side.

An embedded Redis, 2 simulated replicas with 8 slots each, one worker per replica
(8 episode workers each), the collector (each a process, as ``up`` runs them), and a
trainer that takes each batch, pauses the farm (barrier), "trains" for ``TRAIN_S``,
acknowledges the batch, raises the policy version and resumes
(:mod:`queue_rollout.lab.trainer`).
The prompt set is the long-tail profile at a small scale: per group of 4, three short
episodes and one long one (its position rotating by prompt). It runs group admission,
then sample refill, with a live view on a terminal, then a summary; the processes'
logs go under ``<state_dir>/demo/logs``.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import Config
from queue_rollout.lab.trainer import TakenBatch, run_trainer
from queue_rollout.lab.virtual.figures import mean_rollout_interval, rollout_intervals
from queue_rollout.lab.virtual.ideal import rollout_settings
from queue_rollout.lab.virtual.shape import Shape
from queue_rollout.lab.workloads.pilots import long_tail_lengths
from queue_rollout.launch.owner import Owner
from queue_rollout.launch.targets import clear_targets, targets_path, write_up_targets
from queue_rollout.launch.up import LocalFarm
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import EmbeddedRedis, free_port
from queue_rollout.progress import LiveView, log_to_file

GROUP, BATCH, PROMPTS, SHORT, LONG = 4, 4, 32, 256, 2048
REPLICAS, SLOTS = 2, 8
TRAIN_S, TRAIN_BATCHES = 1.0, 4
TIME_SCALE = 4  # the replicas decode, and the collector steps, this much faster
#: The farm's shape, as the ``[rollout]`` section is built from it.
SHAPE = Shape(group_size=GROUP, batch_size=BATCH, replicas=REPLICAS, slots_per_replica=SLOTS)


def demo_prompts(n: int = PROMPTS) -> list[dict[str, Any]]:
    lengths = long_tail_lengths(n, GROUP, short=SHORT, long=LONG)
    return [{"id": f"demo-{i:03d}", "prompt": f"demo prompt {i}", "member_lengths": members}
            for i, members in enumerate(lengths.values())]


def mode_config(base: Config, redis_url: str, mode: str, state_dir: Path) -> Config:
    return msgspec.convert({
        "farm": {"name": f"demo-{mode}", "redis_url": redis_url, "state_dir": str(state_dir)},
        "rollout": rollout_settings(SHAPE, mode, max_staleness=2),
        "engine": {"replicas": REPLICAS, "slots_per_replica": SLOTS,
                   "step_ms": base.engine.step_ms / TIME_SCALE,
                   "step_ms_per_request": base.engine.step_ms_per_request / TIME_SCALE},
        "collector": {"step_ms": base.collector.step_ms / TIME_SCALE},
        "metrics": {"port": free_port()},
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

    def ready(self, taken: TakenBatch) -> None:
        self.ready_times.append(taken.ready)

    def done(self, taken: TakenBatch) -> None:
        if taken.resumed is not None:
            self.resumed_times.append(taken.resumed)
        self.batches += 1

    @property
    def rollout_intervals(self) -> list[float]:
        """Each rollout interval: from the farm resuming after a training step to the
        next batch ready."""
        return rollout_intervals(self.ready_times, self.resumed_times)

    @property
    def mean_rollout_interval(self) -> float:
        return mean_rollout_interval(self.ready_times, self.resumed_times)


def run_mode(base: Config, redis_url: str, mode: str, root: Path,
             logs: Path | None) -> ModeReport:
    config = mode_config(base, redis_url, mode, root / mode)
    farm = LocalFarm(config, root / mode / "farm.toml",
                     log_dir=None if logs is None else logs / mode)
    farm.start()
    # as `up` does: a Prometheus reading <state_dir>/demo/<mode>/prometheus scrapes it
    write_up_targets(farm.config, farm.replica_urls)
    stop = threading.Event()
    report = ModeReport(mode)
    try:
        farm.wait_ready(stop)
        client = RolloutClient(Ledger.from_config(connect(redis_url), config), config)
        client.submit(demo_prompts())
        t0 = time.monotonic()
        with LiveView(f"{mode:>6}", PROMPTS, "groups") as view:
            sampler = threading.Thread(target=_sample, args=(client, report, stop, view),
                                       daemon=True)
            sampler.start()
            run_trainer(client, t0, batches=PROMPTS // BATCH, train_batches=TRAIN_BATCHES,
                        train_s=TRAIN_S, timeout=300, on_ready=report.ready, on_done=report.done)
            report.seconds = time.monotonic() - t0
            stop.set()
            sampler.join(5)
            _show(view, client.status())  # the end, drawn whole
        c = client.ledger.counters()
        report.accepted, report.rejected = c.get("accepted", 0), c.get("rejected", 0)
    finally:
        stop.set()
        clear_targets(targets_path(config))
        farm.stop()
    return report


def _sample(client: RolloutClient, report: ModeReport, stop: threading.Event,
            view: LiveView) -> None:
    last = time.monotonic()
    while not stop.wait(0.1):
        s = client.status()
        now = time.monotonic()
        if not s["paused"]:
            report.active_area += s["active_episodes"] * (now - last)
            report.generating += now - last
        last = now
        _show(view, s)


def _show(view: LiveView, s: dict[str, Any]) -> None:
    """Groups consumed; slots reserved (by admitted groups) of the capacity, episodes
    running, groups pending, in flight and ready; the policy version."""
    g = s["groups"]
    view.show(g["consumed"], reserved=f"{s['reserved']}/{s['capacity']} slots",
              running=s["active_episodes"], pending=g["pending"],
              in_flight=g["in_flight"], ready=g["ready"],
              version=f"v{s['version']}{' paused' if s['paused'] else ''}")


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f} to {max(values):.2f} s" if values else "none"


def run_stack_demo(base: Config, out: TextIO = sys.stdout, *, verbose: bool = False) -> int:
    """Both modes on the real stack, then the summary. Every process's log goes under
    ``<state_dir>/demo/logs`` (the terminal shows them with *verbose*)."""
    root = Path(base.farm.state_dir).resolve() / "demo"
    with Owner(root.with_suffix(".lock"), f"a demo is already running in {root}"):
        return _run_stack_demo(base, root, out, verbose)


def _run_stack_demo(base: Config, root: Path, out: TextIO, verbose: bool) -> int:
    shutil.rmtree(root, ignore_errors=True)
    logs = root / "logs"
    if not verbose:
        log_to_file(logs / "demo.log")
    out.write(f"queue-rollout demo: {PROMPTS} prompts x G={GROUP} ({GROUP - 1} x {SHORT} + "
              f"1 x {LONG} tokens), B={BATCH}: {PROMPTS // BATCH} batches, the first "
              f"{TRAIN_BATCHES} each followed by a {TRAIN_S:g} s training pause, the rest "
              f"drained; {REPLICAS} simulated replicas x {SLOTS} slots; embedded Redis, "
              "workers, collector: the real stack\n")
    out.flush()
    with EmbeddedRedis(root / "redis", write_url=False) as redis_server:
        reports = [run_mode(base, redis_server.url, mode, root, None if verbose else logs)
                   for mode in ("group", "sample")]
    g, s = reports
    rows = [
        ("groups accepted", g.accepted, s.accepted, "d"),
        ("groups rejected", g.rejected, s.rejected, "d"),
        ("batches", g.batches, s.batches, "d"),
        ("mean rollout interval (s)", g.mean_rollout_interval, s.mean_rollout_interval,
         ".2f"),
        ("all batches delivered (s)", g.seconds, s.seconds, ".2f"),
        ("mean active episodes", g.mean_active, s.mean_active, ".2f"),
        ("slot occupancy", g.mean_active / (REPLICAS * SLOTS),
         s.mean_active / (REPLICAS * SLOTS), ".3f"),
    ]
    out.write(f"\n  {'':<28}{'group admit':>13}{'sample refill':>15}\n")
    for name, a, b, fmt in rows:
        out.write(f"  {name:<28}{format(a, fmt):>13}{format(b, fmt):>15}\n")
    out.write(
        "\n  rollout interval: from the farm resuming after a training step to the next "
        "batch ready\n  (mean over the trained batches; this run's spread: group "
        f"{_spread(g.rollout_intervals)}, sample {_spread(s.rollout_intervals)})\n"
        "  all batches delivered: from the prompts submitted to the last batch taken\n"
        "  active episodes: running while the farm was not paused; occupancy: that over "
        f"the {REPLICAS * SLOTS} slots\n"
        "\n(one run of each, real processes and wall-clock seconds on this machine: on a "
        "busy machine\n a run may take a quarter longer than the last; `queue-rollout bench "
        "--profile long-tail`\n repeats and audits, `queue-rollout demo --virtual` runs the "
        "reference shape in virtual time)\n")
    if not verbose:
        out.write(f"logs: {logs}\n")
    return 0
