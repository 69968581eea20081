"""``queue-rollout bench --profile redis-load --cells 1,2,3``: what each Redis of a farm
of cells carries, measured on each server, beside what the farm of one Redis predicts.

For each K listed, a farm of ``gpus`` simulated GPUs (an `up`-shaped farm: a replica, a
worker and an episode process of ``slots`` threads each, and the collector): at K = 1
today's farm on one Redis; at K > 1 a control Redis and K cells, each its own
redis-server, the GPUs dealt evenly over the cells. Every figure comes from each
server's own ``INFO`` (as the single-server redis-load bench reads one), in units of
one trivial script call measured on that server in the same run:

1. **baseline**: the empty servers, for ``idle_s``, subtracted from what follows;
2. **idle**: the farm with nothing to do, for ``idle_s``: each server's units/s;
3. **bursts**: ``burst_rounds`` times ``burst_groups`` groups of tiny episodes through
   the whole farm (the trainer takes and acknowledges every batch): each server's units
   above its idle rate per episode it ran (a cell's own count) and, on the control
   Redis, per group; the median round;
4. **running**: every slot holding a long episode, for ``run_s``: each server's units/s
   above idle per running episode it holds (a small difference of two readings);
5. **the unit**: trivial calls on each server after each burst (the median);
6. at K > 1, **one more burst** with the control Redis's slow log taking every command:
   its script calls per group by name (settle once a group, reserve once and again at
   each step while the group waits for room; the leader lease and the trainer's polls
   for a batch once a step or a poll, not a group).

K = 1 is the calibration: with a collector alone (a farm of no GPUs) before it, its
figures are the collector's units/s, the idle units per GPU, the units per episode and
per running episode. With the control Redis's units per group measured on a private
Redis (:func:`~queue_rollout.lab.control_cost.measure_control_per_group`, the figure
``plan --cells`` uses), they predict each server of K > 1, as ``plan --cells`` does:
a cell carries a collector's thread, its GPUs' idle load, its episodes and its leases;
the control Redis a collector's and its groups. The JSON has both for every server, and
the control Redis's cost per group measured again with each call 2 ms and 10 ms apart
(``control_per_group_spaced``): the same calls cost more when they come seldom.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import redis

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import CellConfig, Config
from queue_rollout.errors import BadInput, InvariantViolation
from queue_rollout.lab.bench.redis_load import (
    BATCH,
    collector_alone,
    long_episode_tokens,
    redis_load_config,
)
from queue_rollout.lab.control_cost import measure_control_per_group
from queue_rollout.lab.redis_info import (
    UNIT_CALLS,
    Window,
    above,
    profiled,
    read,
    trivial_calls,
)
from queue_rollout.launch.up import LocalFarm
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.scripts import script_names

#: The name of the server of a farm of one Redis, and of a farm of cells' control Redis.
FARM, CONTROL = "farm", "control"
#: The pauses (s) after each of the control Redis's calls when its cost per group is
#: measured again at lower rates, and the groups each time.
SPACED_S, SPACED_GROUPS = (0.002, 0.01), 480


@dataclass
class ServerLoad:
    """One Redis of one topology: its windows and what it ran."""

    name: str  # FARM, CONTROL or the cell's name
    gpus: int  # the GPUs whose workers use it (0: the control Redis)
    baseline: Window | None = None
    alone: Window | None = None  # a collector alone (a farm of no GPUs): K = 1 only
    idle: Window | None = None
    bursts: list[Window] = field(default_factory=list)
    burst_episodes: list[int] = field(default_factory=list)  # it ran, each burst
    units: list[Window] = field(default_factory=list)
    running: Window | None = None
    running_episodes: int = 0
    # one more burst with the slow log taking every command: script calls by name
    scripts: dict[str, int] = field(default_factory=dict)

    def _core(self, w: Window | None) -> Window:
        if w is None:
            raise InvariantViolation(f"bench redis-load --cells: {self.name} not measured")
        return w

    @property
    def unit_ms(self) -> float:
        return statistics.median(1000.0 * above(w, self._core(self.idle))[1] / UNIT_CALLS
                                 for w in self.units)

    def units_per_s(self, w: Window, ref: Window) -> float:
        """*w*'s Redis CPU above *ref*'s rate, in units per second."""
        return 1000.0 * above(w, ref)[1] / w.seconds / self.unit_ms

    @property
    def idle_units_per_s(self) -> float:
        return self.units_per_s(self._core(self.idle), self._core(self.baseline))

    @property
    def alone_units_per_s(self) -> float | None:
        return (None if self.alone is None
                else self.units_per_s(self.alone, self._core(self.baseline)))

    def burst_units(self) -> list[float]:
        """Each burst's units above the idle rate."""
        return [1000.0 * above(w, self._core(self.idle))[1] / self.unit_ms
                for w in self.bursts]

    @property
    def _median_burst(self) -> int:
        """The index of the median burst by units (the first of two middles)."""
        units = self.burst_units()
        return sorted(range(len(units)), key=units.__getitem__)[(len(units) - 1) // 2]

    @property
    def units_per_episode(self) -> float | None:
        if not any(self.burst_episodes):
            return None
        return statistics.median(u / n for u, n in zip(self.burst_units(),
                                                       self.burst_episodes, strict=True) if n)

    def units_per_group(self, groups: int) -> float:
        return self.burst_units()[self._median_burst] / groups

    def calls_per(self, groups: int | None = None) -> dict[str, float]:
        """The median burst's calls by command (a script by EVALSHA, its commands under
        their own names), per group of *groups*, else per episode this server ran in
        it; most first."""
        i = self._median_burst
        count = groups or max(1, self.burst_episodes[i])
        return {k: round(v / count, 3) for k, v in
                sorted(self.bursts[i].calls.items(), key=lambda kv: -kv[1])[:10]}

    @property
    def running_units_per_episode_s(self) -> float | None:
        if not self.running_episodes:
            return None
        return (self.units_per_s(self._core(self.running), self._core(self.idle))
                / self.running_episodes)


@dataclass
class Topology:
    cells: int  # K; 1: a farm of one Redis
    servers: list[ServerLoad]
    burst_groups: int


@dataclass
class Calibration:
    """The farm of one Redis's figures (units), and the control Redis's per group."""

    collector: float
    idle_per_gpu: float
    per_episode: float
    running_per_episode: float
    control_per_group: float

    @classmethod
    def of(cls, one: Topology, control_per_group: float) -> Calibration:
        (farm,) = one.servers
        collector = farm.alone_units_per_s or 0.0
        return cls(collector, (farm.idle_units_per_s - collector) / farm.gpus,
                   farm.units_per_episode or 0.0, farm.running_units_per_episode_s or 0.0,
                   control_per_group)

    def predict(self, server: ServerLoad) -> dict[str, float]:
        """What *server* of a farm of cells carries, predicted: a cell as a farm of one
        of its GPUs; the control Redis a collector, nothing per GPU, and per group."""
        if server.name == CONTROL:
            return {"idle_units_per_s": self.collector, "units_per_group": self.control_per_group}
        return {"idle_units_per_s": self.collector + self.idle_per_gpu * server.gpus,
                "units_per_episode": self.per_episode,
                "running_units_per_episode_s": self.running_per_episode}


def _cells_config(servers: dict[str, str], state: Path, gpus: int, slots: int) -> Config:
    """The single-server bench's farm on *servers* (name -> URL): FARM alone, or CONTROL
    and the cells (an even share of the slots each)."""
    config = redis_load_config(servers.get(FARM) or servers[CONTROL], state, gpus, slots, 0)
    return msgspec.structs.replace(config, cells=[
        CellConfig(name=n, redis_url=u) for n, u in servers.items() if n not in (FARM, CONTROL)])


def _read_all(meters: dict[str, redis.Redis]) -> dict[str, Any]:
    return {name: read(m) for name, m in meters.items()}


def _windows(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Window]:
    return {name: Window.between(a[name], b[name]) for name in a}


def _finished(client: RolloutClient) -> dict[str, int]:
    """Episodes finished so far, by server."""
    ledgers = client.cells or {FARM: client.ledger}
    return {name: ledger.counters().get("finished", 0) for name, ledger in ledgers.items()}


def _burst(client: RolloutClient, meters: dict[str, redis.Redis], groups: int, tag: str
           ) -> tuple[dict[str, Window], dict[str, int]]:
    """*groups* groups of tiny episodes through the farm, every batch taken and
    acknowledged: each server's window and the episodes each ran."""
    g, b = client.config.rollout.group_size, client.config.rollout.batch_size
    before = _finished(client)
    a = _read_all(meters)
    client.submit([{"id": f"burst{tag}-{i}", "prompt": "x", "member_lengths": [4] * g}
                   for i in range(groups)])
    for _ in range(groups // b):
        client.ack(client.get_batch(timeout=300))
    windows = _windows(a, _read_all(meters))
    ran = {name: n - before[name] for name, n in _finished(client).items()}
    if sum(ran.values()) != groups * g:
        raise InvariantViolation(f"bench redis-load --cells: {sum(ran.values())} episodes "
                                 f"of {groups * g}")
    return windows, ran


def _fill(client: RolloutClient, slots_each: dict[str, int], run_s: float) -> None:
    """Long episodes in every slot of every server (more groups than slots: the hash
    deals them unevenly), until each server's slots are all running."""
    g = client.config.rollout.group_size
    tokens = long_episode_tokens(client.config, run_s + 60.0)
    client.submit([{"id": f"long-{i}", "prompt": "x", "member_lengths": [tokens] * g}
                   for i in range(3 * sum(slots_each.values()) // g)])
    ledgers = client.cells or {FARM: client.ledger}
    deadline = time.monotonic() + 90
    while any(ledgers[n].counters().get("running", 0) < s for n, s in slots_each.items()):
        if time.monotonic() > deadline:
            raise InvariantViolation("bench redis-load --cells: the slots did not fill")
        time.sleep(0.2)
    time.sleep(1.0)


def run_topology(cells: int, *, gpus: int, slots: int, idle_s: float, burst_groups: int,
                 burst_rounds: int, run_s: float, workdir: Path,
                 progress: Callable[[str], None]) -> Topology:
    """One farm of *cells* cells (1: one Redis) measured, server by server."""
    names = [FARM] if cells == 1 else [CONTROL, *(f"c{i}" for i in range(cells))]
    with contextlib.ExitStack() as stack:
        urls = {}
        for name in names:
            server = EmbeddedRedis(workdir / "redis" / name, write_url=False)
            urls[name] = server.start()
            stack.callback(server.stop)
        meters = {name: connect(url) for name, url in urls.items()}
        for m in meters.values():
            stack.callback(m.close)
        config = _cells_config(urls, workdir / "farm", gpus, slots)
        each = gpus // cells
        servers = {n: ServerLoad(n, 0 if n == CONTROL else each if cells > 1 else gpus)
                   for n in names}
        progress(f"redis-load --cells {cells}: the empty servers for {idle_s:g}s")
        a = _read_all(meters)
        time.sleep(idle_s)
        for name, w in _windows(a, _read_all(meters)).items():
            servers[name].baseline = w
        if cells == 1:
            progress(f"redis-load --cells 1: a collector alone for {idle_s:g}s")
            servers[FARM].alone = collector_alone(config, meters[FARM], workdir, idle_s,
                                                  log=True)[0]
        farm = LocalFarm(config, workdir / "farm" / "farm.toml", log_dir=workdir / "logs")
        stack.callback(farm.stop)
        farm.start()
        if not farm.wait_ready(threading.Event()):
            raise InvariantViolation(f"bench redis-load --cells {cells}: the farm did not "
                                     f"come up: {'; '.join(farm.unready)}")
        client = RolloutClient.from_config(farm.config)
        time.sleep(3.0)  # let start-up settle
        progress(f"redis-load --cells {cells}: {gpus} GPUs x {slots} slots idle for "
                 f"{idle_s:g}s")
        a = _read_all(meters)
        time.sleep(idle_s)
        for name, w in _windows(a, _read_all(meters)).items():
            servers[name].idle = w
        for r in range(burst_rounds):
            progress(f"redis-load --cells {cells}: burst {r + 1} of {burst_rounds}, "
                     f"{burst_groups} groups of 8 tiny episodes, then the unit on each "
                     "server")
            windows, ran = _burst(client, meters, burst_groups, f"r{r}")
            for name, w in windows.items():
                servers[name].bursts.append(w)
                servers[name].burst_episodes.append(ran.get(name, 0))
            for name, m in meters.items():
                servers[name].units.append(trivial_calls(m))
        if cells > 1:
            progress(f"redis-load --cells {cells}: one more burst, the control Redis's "
                     "scripts counted by name (its slow log)")
            profile = profiled(meters[CONTROL],
                               lambda: _burst(client, meters, burst_groups, "prof"),
                               script_names())
            servers[CONTROL].scripts = {name: calls for name, (calls, _) in profile.items()
                                        if name.endswith(".lua")}
        progress(f"redis-load --cells {cells}: every slot running for {run_s:g}s")
        held = {n: s.gpus * slots for n, s in servers.items() if s.gpus}
        _fill(client, held, run_s)
        a = _read_all(meters)
        time.sleep(run_s)
        for name, w in _windows(a, _read_all(meters)).items():
            servers[name].running = w
            servers[name].running_episodes = held.get(name, 0)
    return Topology(cells, list(servers.values()), burst_groups)


def run_cells_bench(counts: Sequence[int], *, gpus: int = 6, slots: int = 16,
                    idle_s: float = 20.0, burst_groups: int = 48, burst_rounds: int = 3,
                    run_s: float = 20.0, spaced_groups: int = SPACED_GROUPS, workdir: Path,
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Each topology of *counts* (K = 1 among them: the calibration) measured in turn,
    and the control Redis's units per group on a private Redis; the JSON."""
    if 1 not in counts:
        raise BadInput("--cells: K = 1 (a farm of one Redis) calibrates the prediction")
    if any(gpus % k for k in counts):
        raise BadInput(f"--gpus {gpus}: not dealt evenly over {', '.join(map(str, counts))} "
                       "cells")
    if burst_groups < BATCH:
        raise BadInput(f"--burst-groups {burst_groups}: a burst is whole batches of {BATCH}")
    burst_groups -= burst_groups % BATCH
    topologies = {k: run_topology(k, gpus=gpus, slots=slots, idle_s=idle_s,
                                  burst_groups=burst_groups, burst_rounds=burst_rounds,
                                  run_s=run_s, workdir=workdir / f"k{k}", progress=progress)
                  for k in sorted(set(counts), key=lambda k: k != 1)}
    progress("redis-load --cells: the control Redis's units per group, on a private Redis: "
             "back to back, then with each call " + " and ".join(
                 f"{1000 * g:g} ms" for g in SPACED_S) + " apart")
    with tempfile.TemporaryDirectory(dir=workdir) as scratch:
        per_group = measure_control_per_group(Path(scratch) / "0")
        spaced = {g: measure_control_per_group(Path(scratch) / str(g), groups=spaced_groups,
                                               rounds=1, gap_s=g) for g in SPACED_S}
    calibration = Calibration.of(topologies[1], per_group)
    out = cells_json(topologies, calibration, gpus=gpus, slots=slots)
    out["control_per_group_spaced"] = {f"{g:g}": round(v, 3) for g, v in spaced.items()}
    return out


def _server_json(s: ServerLoad, groups: int) -> dict[str, Any]:
    measured: dict[str, Any] = {"gpus": s.gpus, "unit_us": round(1000.0 * s.unit_ms, 3),
                                "idle_units_per_s": round(s.idle_units_per_s, 2),
                                "episodes_each_burst": s.burst_episodes}
    if s.alone is not None:
        measured["collector_alone_units_per_s"] = round(s.alone_units_per_s or 0.0, 2)
    if s.units_per_episode is not None:
        measured["units_per_episode"] = round(s.units_per_episode, 3)
    if s.running_units_per_episode_s is not None:
        measured["running_units_per_episode_s"] = round(s.running_units_per_episode_s, 4)
    if s.name == CONTROL:
        measured["units_per_group"] = round(s.units_per_group(groups), 3)
        measured["groups_per_s"] = round(groups / statistics.median(
            w.seconds for w in s.bursts), 1)
        measured["calls_per_group"] = s.calls_per(groups)
        measured["scripts_per_group"] = {name: round(calls / groups, 3) for name, calls in
                                         sorted(s.scripts.items(), key=lambda kv: -kv[1])}
    elif s.burst_episodes:
        measured["calls_per_episode"] = s.calls_per()
    return measured


def cells_json(topologies: dict[int, Topology], calibration: Calibration, *, gpus: int,
               slots: int) -> dict[str, Any]:
    rows = []
    for k, t in sorted(topologies.items()):
        for s in t.servers:
            row = {"cells": k, "server": s.name, **_server_json(s, t.burst_groups)}
            if k > 1:
                row["predicted"] = {key: round(v, 3) for key, v in
                                    calibration.predict(s).items()}
            rows.append(row)
    return {"profile": "redis-load-cells", "gpus": gpus, "slots_per_gpu": slots,
            "burst_groups": next(iter(topologies.values())).burst_groups,
            "calibration": {k: round(v, 4) for k, v in vars(calibration).items()},
            "servers": rows}


def cells_text(r: dict[str, Any]) -> str:
    c = r["calibration"]
    lines = [f"bench redis-load --cells: {r['gpus']} GPUs x {r['slots_per_gpu']} slots, "
             f"bursts of {r['burst_groups']} groups; units of one trivial call on each "
             "server; measured (predicted from K = 1)",
             f"  K = 1 calibrates: a collector {c['collector']:.1f} units/s, idle "
             f"{c['idle_per_gpu']:.2f} a GPU, {c['per_episode']:.2f} an episode, "
             f"{c['running_per_episode']:.3f} a running episode a second; the control "
             f"Redis {c['control_per_group']:.2f} a group (a private Redis, back to back"
             + "".join(f"; {v:.2f} with its calls {1000 * float(g):g} ms apart"
                       for g, v in r.get("control_per_group_spaced", {}).items()) + ")",
             f"  {'K':>2} {'server':<8} {'GPUs':>4} {'idle units/s':>20} "
             f"{'units/episode':>20} {'units/group':>20} {'running units/ep/s':>22}"]

    def cell(row: dict[str, Any], key: str, width: int) -> str:
        got = row.get(key)
        if got is None:
            return " " * width
        guess = row.get("predicted", {}).get(key)
        text = f"{got:.3g}" + ("" if guess is None else f" ({guess:.3g})")
        return f"{text:>{width}}"

    for row in r["servers"]:
        per_group = cell(row, "units_per_group", 20) if row["server"] == CONTROL else " " * 20
        lines.append(f"  {row['cells']:>2} {row['server']:<8} {row['gpus']:>4} "
                     f"{cell(row, 'idle_units_per_s', 20)} "
                     f"{cell(row, 'units_per_episode', 20)} {per_group} "
                     f"{cell(row, 'running_units_per_episode_s', 22)}")
    return "\n".join(lines)
