"""``queue-rollout bench --profile redis-load``: what the control plane costs Redis,
measured by Redis itself.

One private Redis; every figure comes from its ``INFO commandstats`` (calls, commands
run inside scripts included), ``INFO cpu`` (``used_cpu_sys + used_cpu_user``) and
``INFO clients``. The bench's own ``INFO`` calls are left out.

1. **Baseline**: the Redis with nothing attached, for ``idle_s``: its own cost,
   subtracted from every phase after.
2. **The collector alone**: a collector of a farm with no GPUs, for ``idle_s``: what a
   farm costs Redis whatever its size (its leader lease, admission and reconciler
   ticks), kept apart so that it is not counted once per GPU.
3. **Idle farm**: an ``up``-shaped farm of ``gpus`` simulated GPUs (each its own sim
   replica, worker supervisor and episode process of ``slots`` threads) and the
   collector, with nothing to do, for ``idle_s``: calls/s, Redis CPU and connections
   per GPU, the collector's own subtracted.
4. **Bursts**: ``burst_rounds`` times ``burst_groups`` groups of tiny episodes through
   the whole farm (submit, admission, RQ, the workers, judgement, batches taken and
   acknowledged): Redis commands and CPU per episode, the idle rate subtracted; the
   median round is the figure (on a shared 2-core machine single rounds differ by
   tens of percent), every round is in the JSON.
5. **Running**: every slot holding a long episode (its lease renewed every lease / 3),
   for ``run_s``: the calls and CPU per running episode, the idle rate subtracted (a
   small difference of two readings: at 16 slots a GPU's leases cost Redis less than
   its own timers move).
6. **The leases priced**: the running attempts' records copied under a scratch farm's
   keys and renewed there by the ledger's own call, one call per worker process with
   all its attempts (as its lease keeper sends them: its own lease renewed, nothing new
   reported), ``RENEWAL_ROUNDS`` times over, a renewal period (lease / 3) apart on the
   ledger's clock, the running farm's rate subtracted: the Redis CPU of one attempt's
   renewal, one per lease / 3 being a running episode's lease (the projections take
   it). The same renewals are then priced one attempt to a call, beside it. Then,
   ``RENEWAL_ROUNDS`` times, a lease later each time, every holder's lease renewed and
   the collector's sweep that extends each attempt's lease to its holder's: what an
   attempt whose renewals stopped costs while its process lives.

**The unit.** After each burst, :data:`~queue_rollout.lab.redis_info.UNIT_CALLS` trivial
script calls one at a time on one connection (the idle rate subtracted): the Redis CPU
of one such call is the unit every CPU figure is also given in, measured on the same
server in the same run (absolute CPU per call moves between machines and with their
load; the unit moves with it). The median of the measurements is the unit.

**The profile.** One more burst with Redis's slow log taking every command: per
episode, the calls of each command (a script by its operation's name; Redis logs the
commands a script runs too, so they count under their own names as well) and the
microseconds the log timed them (execution, no I/O; a script's include its commands',
and logging each of them inflates it: a relative figure). Not in the per-episode
figures above.

Then the projections to farms of ``PROJECTIONS`` (GPUs, slots each, episode seconds):
the collector + idle GPUs + busy (episodes/s x cost per episode) + running (leases,
priced), in
units per second and as a share of a quiet core (``QUIET_CORE_UNITS_PER_S``; Redis runs
commands on one thread), and, in ms, as a share of this run's core.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import redis

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import Config, write_config
from queue_rollout.errors import InvariantViolation
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
from queue_rollout.ledger.core import Ledger, Renewal
from queue_rollout.ledger.embedded import EmbeddedRedis, free_port, replica_of
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.records import decode_attempt
from queue_rollout.ledger.scripts import script_names
from queue_rollout.procs import Supervised, cli_exe, stop_all

PROJECT_GPUS, PROJECT_SLOTS, PROJECT_EPISODE_S = 1024, 16, 10.0
#: The farms projected in units: (GPUs, slots per GPU, seconds per episode).
PROJECTIONS = ((1024, 16, 10.0), (1024, 128, 30.0))
#: Times each worker process's running attempts are renewed when the renewals are priced.
RENEWAL_ROUNDS = 200
#: The bench farms' batch size (B): a burst is whole batches.
BATCH = 16
#: Trivial calls a quiet core runs per second (one call costs it about 10 us of CPU).
QUIET_CORE_UNITS_PER_S = 100_000.0
#: What one Redis must stay under: per GPU idle, per episode, ...
TARGETS = {"idle_calls_per_gpu_s": 4.0, "idle_core_pct_per_gpu": 0.02,
           "connections_per_gpu": 20.0, "commands_per_episode": 60.0,
           "redis_cpu_ms_per_episode": 0.35, "running_core_pct_per_episode": 0.001,
           "projected_core_pct": 95.0,
           "idle_units_per_gpu_s": 8.0, "units_per_episode": 10.0,
           "running_units_per_episode_s": 0.1, "projected_quiet_core_pct_1024x128": 70.0}


@dataclass
class RedisLoadResult:
    gpus: int
    slots_per_gpu: int
    baseline: Window
    idle: Window
    connections: int  # the farm's, the bench's own left out
    bursts: list[Window]  # one per round, each of burst_episodes episodes
    burst_episodes: int
    running: Window
    running_episodes: int
    collector: Window | None = None  # the collector alone (None: counted per GPU)
    collector_connections: int = 0
    pause_barrier_s: list[float] = field(default_factory=list)  # each pause() call
    resume_s: list[float] = field(default_factory=list)  # resume() to every replica going
    wait_replicas: int = 0  # farm.redis_wait_replicas of the farm measured
    replicas: int = 0  # replicas following the Redis (at least wait_replicas)
    placement: str = "any"  # the farm's rollout.placement
    notes: list[str] = field(default_factory=list)
    units: list[Window] = field(default_factory=list)  # each of unit_calls trivial calls
    unit_calls: int = UNIT_CALLS
    # one more burst with every command in Redis's slow log: (calls, us) by command
    profile: dict[str, tuple[int, int]] = field(default_factory=dict)
    profile_episodes: int = 0
    # the running attempts' renewals priced: the window, the attempt renewals it made,
    # and the seconds between a running attempt's renewals (lease / 3)
    renewals: Window | None = None
    renewal_count: int = 0
    renewal_period_s: float = 10.0
    renewals_alone: Window | None = None  # the same renewals, one attempt to a call
    # the sweeps that extend each attempt to its holder's lease, and the extensions
    # they made
    extensions: Window | None = None
    extension_count: int = 0

    # -- per unit, above the empty server ---------------------------------------------

    @property
    def _fixed(self) -> Window:
        """What the farm costs whatever its size: the collector alone, else nothing
        beyond the empty server."""
        return self.collector if self.collector is not None else self.baseline

    @property
    def collector_calls_per_s(self) -> float:
        return self._fixed.calls_per_s - self.baseline.calls_per_s

    @property
    def collector_core_pct(self) -> float:
        return self._fixed.core_pct - self.baseline.core_pct

    @property
    def idle_calls_per_gpu_s(self) -> float:
        return (self.idle.calls_per_s - self._fixed.calls_per_s) / self.gpus

    @property
    def idle_core_pct_per_gpu(self) -> float:
        return (self.idle.core_pct - self._fixed.core_pct) / self.gpus

    @property
    def connections_per_gpu(self) -> float:
        return (self.connections - self.collector_connections) / self.gpus

    def _above_idle(self, w: Window) -> tuple[float, float]:
        """(calls, cpu seconds) of *w* above the idle farm's rates."""
        return above(w, self.idle)

    @property
    def rounds_cpu_ms_per_episode(self) -> list[float]:
        return [1000.0 * self._above_idle(w)[1] / self.burst_episodes for w in self.bursts]

    @property
    def burst(self) -> Window:
        """The median round by Redis CPU per episode (the first of two middles)."""
        order = sorted(self.bursts, key=lambda w: self._above_idle(w)[1])
        return order[(len(order) - 1) // 2]

    @property
    def commands_per_episode(self) -> float:
        return self._above_idle(self.burst)[0] / self.burst_episodes

    @property
    def redis_cpu_ms_per_episode(self) -> float:
        return 1000.0 * self._above_idle(self.burst)[1] / self.burst_episodes

    @property
    def running_calls_per_episode_s(self) -> float:
        return self._above_idle(self.running)[0] / self.running.seconds / self.running_episodes

    @property
    def running_core_pct_per_episode(self) -> float:
        return (100.0 * self._above_idle(self.running)[1] / self.running.seconds
                / self.running_episodes)

    def _renewal_ms(self, w: Window | None, count: int | None = None) -> float | None:
        count = self.renewal_count if count is None else count
        if w is None or not count:
            return None
        return 1000.0 * above(w, self.running)[1] / count

    @property
    def renewal_ms(self) -> float | None:
        """Redis CPU ms of one attempt's lease renewal, priced (the running farm's rate
        subtracted); None where the renewals were not priced."""
        return self._renewal_ms(self.renewals)

    @property
    def renewal_alone_ms(self) -> float | None:
        """The same, each attempt renewed in a call of its own."""
        return self._renewal_ms(self.renewals_alone)

    @property
    def extension_ms(self) -> float | None:
        """Redis CPU ms of the sweep extending one attempt's lease to its holder's (the
        holders' renewals in the same rounds included): what an attempt whose renewals
        stopped costs while its holder lives."""
        return self._renewal_ms(self.extensions, self.extension_count)

    @property
    def lease_core_pct_per_episode(self) -> float:
        """% of a core a running episode's lease costs: the priced renewal at one per
        lease / 3 (renewed on time, an attempt's lease never needs the sweep); the
        running window's figure where the renewals were not priced."""
        if self.renewal_ms is None:
            return self.running_core_pct_per_episode
        return self.renewal_ms / self.renewal_period_s / 10.0  # ms/s -> %

    # -- in trivial-call units -----------------------------------------------------------

    @property
    def rounds_unit_ms(self) -> list[float]:
        """Redis CPU ms of one trivial call, each measurement (the idle rate subtracted)."""
        return [1000.0 * self._above_idle(w)[1] / self.unit_calls for w in self.units]

    @property
    def unit_ms(self) -> float:
        """The unit: the median of :attr:`rounds_unit_ms`."""
        return statistics.median(self.rounds_unit_ms)

    def _units_per_s(self, core_pct: float) -> float:
        return core_pct * 10.0 / self.unit_ms  # % of a core = 10 ms/s

    @property
    def collector_units_per_s(self) -> float:
        return self._units_per_s(self.collector_core_pct)

    @property
    def idle_units_per_gpu_s(self) -> float:
        return self._units_per_s(self.idle_core_pct_per_gpu)

    @property
    def units_per_episode(self) -> float:
        return self.redis_cpu_ms_per_episode / self.unit_ms

    @property
    def running_units_per_episode_s(self) -> float:
        return self._units_per_s(self.running_core_pct_per_episode)

    @property
    def renewal_units(self) -> float | None:
        return None if self.renewal_ms is None else self.renewal_ms / self.unit_ms

    @property
    def renewal_alone_units(self) -> float | None:
        return None if self.renewal_alone_ms is None else self.renewal_alone_ms / self.unit_ms

    @property
    def extension_units(self) -> float | None:
        return None if self.extension_ms is None else self.extension_ms / self.unit_ms

    @property
    def lease_units_per_episode_s(self) -> float:
        return self._units_per_s(self.lease_core_pct_per_episode)

    def projection_units(self, gpus: int, slots: int, episode_s: float) -> dict[str, float]:
        """A farm of *gpus* x *slots* with *episode_s* episodes in units per second: idle
        (the collector's included), busy and running (leases), their sum as a share of a
        quiet core and of this run's."""
        shares = self._shares(gpus, slots, episode_s)
        idle, busy, running = (self._units_per_s(pct) for pct in shares)
        total = idle + busy + running
        return {"gpus": gpus, "slots_per_gpu": slots, "episode_s": episode_s,
                "idle_units_per_s": round(idle), "busy_units_per_s": round(busy),
                "running_units_per_s": round(running), "units_per_s": round(total),
                "quiet_core_pct": round(100.0 * total / QUIET_CORE_UNITS_PER_S, 1),
                "this_core_pct": round(sum(shares), 1)}

    def episode_profile(self) -> dict[str, dict[str, float]]:
        """Per episode of the profiled burst, each command's (a script by its name)
        calls and the microseconds the slow log timed, most first."""
        n = max(1, self.profile_episodes)
        rows = {name: {"calls": round(calls / n, 3), "usec": round(usec / n, 2)}
                for name, (calls, usec) in self.profile.items()}
        return dict(sorted(rows.items(), key=lambda kv: -kv[1]["usec"]))

    def episode_commands(self) -> dict[str, float]:
        """Commands per episode by name (the burst, idle not subtracted), largest first."""
        per = {k: v / self.burst_episodes for k, v in self.burst.calls.items()}
        return dict(sorted(per.items(), key=lambda kv: -kv[1]))

    def _shares(self, gpus: int, slots: int, episode_s: float) -> tuple[float, float, float]:
        """A farm of *gpus* x *slots* with *episode_s* episodes: idle (the collector's
        included), busy and running (leases), each in % of this run's core."""
        idle = self.collector_core_pct + self.idle_core_pct_per_gpu * gpus
        busy = self.redis_cpu_ms_per_episode * gpus * slots / episode_s / 10.0  # ms/s -> %
        running = self.lease_core_pct_per_episode * gpus * slots
        return idle, busy, running

    def projection(self, gpus: int = PROJECT_GPUS, slots: int = PROJECT_SLOTS,
                   episode_s: float = PROJECT_EPISODE_S) -> dict[str, float]:
        idle, busy, running = self._shares(gpus, slots, episode_s)
        return {"gpus": gpus, "slots": gpus * slots, "episode_s": episode_s,
                "episodes_per_s": round(gpus * slots / episode_s, 1),
                "idle_calls_per_s": round(self.collector_calls_per_s
                                          + self.idle_calls_per_gpu_s * gpus),
                "idle_core_pct": round(idle, 2), "busy_core_pct": round(busy, 2),
                "running_core_pct": round(running, 2),
                "sum_core_pct": round(idle + busy + running, 2),
                "connections": round(self.collector_connections
                                     + self.connections_per_gpu * gpus)}

    def as_json(self) -> dict[str, Any]:
        return {
            "profile": "redis-load", "gpus": self.gpus, "slots_per_gpu": self.slots_per_gpu,
            "wait_replicas": self.wait_replicas, "replicas": self.replicas,
            "placement": self.placement,
            "baseline_core_pct": round(self.baseline.core_pct, 4),
            "baseline_calls_per_s": round(self.baseline.calls_per_s, 2),
            "collector_calls_per_s": round(self.collector_calls_per_s, 2),
            "collector_core_pct": round(self.collector_core_pct, 4),
            "collector_connections": self.collector_connections,
            "idle_calls_per_gpu_s": round(self.idle_calls_per_gpu_s, 3),
            "idle_core_pct_per_gpu": round(self.idle_core_pct_per_gpu, 5),
            "connections_per_gpu": round(self.connections_per_gpu, 2),
            "commands_per_episode": round(self.commands_per_episode, 2),
            "redis_cpu_ms_per_episode": round(self.redis_cpu_ms_per_episode, 4),
            "rounds_cpu_ms_per_episode": [round(v, 4) for v in self.rounds_cpu_ms_per_episode],
            "running_calls_per_episode_s": round(self.running_calls_per_episode_s, 4),
            "running_core_pct_per_episode": round(self.running_core_pct_per_episode, 6),
            "episode_commands": {k: round(v, 2) for k, v in
                                 list(self.episode_commands().items())[:25]},
            # microseconds per episode by command; a script's own commands count in
            # EVALSHA's time too (commandstats times them both), so these overlap
            "episode_usec": {k: round(v / self.burst_episodes, 2) for k, v in sorted(
                self.burst.usec.items(), key=lambda kv: -kv[1])[:12]},
            "running_commands_per_episode_s": {
                k: round(v / self.running_episodes, 4)
                for k, v in list(self.running.per_s_above(self.idle).items())[:12]},
            "idle_commands_per_gpu_s": {
                k: round(v / self.gpus, 3)
                for k, v in list(self.idle.per_s_above(self._fixed).items())[:15]},
            "pause_barrier_s": _median_max(self.pause_barrier_s),
            "resume_s": _median_max(self.resume_s),
            "projection": self.projection(), "targets": TARGETS, "notes": self.notes,
            "unit_calls": self.unit_calls,
            "unit_us": round(1000.0 * self.unit_ms, 3),
            "rounds_unit_us": [round(1000.0 * v, 3) for v in self.rounds_unit_ms],
            "quiet_core_units_per_s": QUIET_CORE_UNITS_PER_S,
            "collector_units_per_s": round(self.collector_units_per_s, 2),
            "idle_units_per_gpu_s": round(self.idle_units_per_gpu_s, 3),
            "units_per_episode": round(self.units_per_episode, 2),
            "running_units_per_episode_s": round(self.running_units_per_episode_s, 4),
            "renewal_count": self.renewal_count,
            "renewal_period_s": self.renewal_period_s,
            "renewal_us": None if self.renewal_ms is None
            else round(1000.0 * self.renewal_ms, 3),
            "renewal_units": None if self.renewal_units is None
            else round(self.renewal_units, 4),
            "renewal_alone_units": None if self.renewal_alone_units is None
            else round(self.renewal_alone_units, 4),
            "extension_count": self.extension_count,
            "extension_us": None if self.extension_ms is None
            else round(1000.0 * self.extension_ms, 3),
            "extension_units": None if self.extension_units is None
            else round(self.extension_units, 4),
            "lease_units_per_episode_s": round(self.lease_units_per_episode_s, 4),
            "lease_core_pct_per_episode": round(self.lease_core_pct_per_episode, 7),
            "projections_units": [self.projection_units(*p) for p in PROJECTIONS],
            "episode_profile": dict(list(self.episode_profile().items())[:20]),
        }


def long_episode_tokens(config: Config, seconds: float) -> int:
    """The tokens of an episode that runs at least *seconds* on a replica of *config*
    with every slot busy."""
    e = config.engine
    return int(seconds / ((e.step_ms + e.step_ms_per_request * e.slots_per_replica) / 1000.0))


def _median_max(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"median": round(statistics.median(values), 4), "max": round(max(values), 4)}


def redis_load_config(redis_url: str, state: Path, gpus: int, slots: int,
                      wait_replicas: int, placement: str = "any") -> Config:
    """The bench's farm: *gpus* simulated GPUs of *slots* slots on *redis_url*, G 8 and B
    :data:`BATCH`, every slot admitted, a staleness budget never reached."""
    return msgspec.convert({
        "farm": {"name": "redis-load", "redis_url": redis_url, "state_dir": str(state),
                 "redis_wait_replicas": wait_replicas},
        "rollout": {"group_size": 8, "batch_size": BATCH, "max_concurrent_samples": gpus * slots,
                    "max_staleness": 1_000_000, "placement": placement},
        "engine": {"replicas": gpus, "slots_per_replica": slots, "threads_per_process": slots,
                   "step_ms": 4.5, "step_ms_per_request": 0.2},
        "metrics": {"port": free_port()},
        "timeouts": {"shutdown_grace": 2},
    }, Config)


def run_redis_load_bench(*, gpus: int = 8, slots: int = 16, idle_s: float = 20.0,
                         burst_groups: int = 100, burst_rounds: int = 3, run_s: float = 20.0,
                         wait_replicas: int = 0, placement: str = "any",
                         replicas: int | None = None, workdir: Path, logs: bool = True,
                         progress: Callable[[str], None] = lambda line: None
                         ) -> RedisLoadResult:
    """*replicas* (default *wait_replicas*) private replicas follow the Redis (their
    own traffic is in the baseline); the farm waits for *wait_replicas* of them on
    every ledger change."""
    replicas = wait_replicas if replicas is None else replicas
    if replicas < wait_replicas:
        raise ValueError(f"{replicas} replicas cannot acknowledge what {wait_replicas} must")
    workdir.mkdir(parents=True, exist_ok=True)
    with EmbeddedRedis(workdir / "redis", write_url=False) as server, \
            contextlib.ExitStack() as followers:
        for i in range(replicas):
            followers.callback(replica_of(server, workdir / f"replica{i}").stop)
        meter = connect(server.url)
        progress(f"redis-load: baseline, the empty Redis for {idle_s:g}s")
        a = read(meter)
        time.sleep(idle_s)
        baseline = Window.between(a, read(meter))
        config = redis_load_config(server.url, workdir / "farm", gpus, slots, wait_replicas,
                                   placement)
        progress(f"redis-load: a collector alone (a farm of no GPUs) for {idle_s:g}s")
        alone, alone_clients = collector_alone(config, meter, workdir, idle_s, log=logs)
        farm = LocalFarm(config, workdir / "farm" / "farm.toml",
                         log_dir=workdir / "logs" if logs else None)
        farm.start()
        stop = threading.Event()
        try:
            if not farm.wait_ready(stop):
                raise InvariantViolation("bench redis-load: the farm did not come up")
            client = RolloutClient(Ledger.from_config(connect(server.url), config), config)
            _await_idle_rq_workers(meter, gpus * slots)
            time.sleep(3.0)  # let start-up settle
            progress(f"redis-load: {gpus} GPUs x {slots} slots idle for {idle_s:g}s")
            a = read(meter)
            time.sleep(idle_s)
            b = read(meter)
            idle = Window.between(a, b)
            connections = b.clients - 2 - replicas  # the meter, the trainer, replicas
            progress("redis-load: the pause barrier and resume, 10 times")
            pauses, resumes = _pause_latency(client, rounds=10)
            bursts: list[Window] = []
            units: list[Window] = []
            for r in range(burst_rounds):
                progress(f"redis-load: burst {r + 1} of {burst_rounds}, {burst_groups} groups "
                         f"of 8 tiny episodes, then the unit ({UNIT_CALLS} trivial calls)")
                burst, episodes = _burst(client, meter, burst_groups, tag=f"r{r}")
                bursts.append(burst)
                units.append(trivial_calls(meter))
            progress("redis-load: one more burst, every command in the slow log")
            profile = profiled(meter, lambda: _burst(client, meter, burst_groups, tag="prof"),
                               script_names())
            progress(f"redis-load: {gpus * slots} long episodes running for {run_s:g}s")
            running, held = _running(client, meter, gpus * slots, run_s)
            progress(f"redis-load: the running attempts' leases priced, {RENEWAL_ROUNDS} "
                     "rounds of renewals and of extensions")
            priced = _priced_leases(client, meter, config)
        finally:
            stop.set()
            farm.stop()
            meter.close()
    return RedisLoadResult(gpus, slots, baseline, idle, connections, bursts, episodes,
                           running, held, alone, alone_clients, pauses, resumes,
                           wait_replicas, replicas, placement, units=units,
                           profile=profile, profile_episodes=episodes,
                           renewals=priced.renewals, renewal_count=priced.renewal_count,
                           renewals_alone=priced.renewals_alone,
                           renewal_period_s=config.timeouts.lease / 3,
                           extensions=priced.extensions,
                           extension_count=priced.extension_count)


def collector_alone(config: Config, meter: redis.Redis, workdir: Path, idle_s: float, *,
                     log: bool) -> tuple[Window, int]:
    """Redis's cost of a collector whose farm (a name of its own) has no GPUs, and its
    connections; the collector is stopped after."""
    alone = msgspec.structs.replace(
        config, farm=msgspec.structs.replace(config.farm, name=config.farm.name + "-alone"),
        metrics=msgspec.structs.replace(config.metrics, port=free_port()))
    path = workdir / "alone" / "farm.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_config(path, alone)
    before = read(meter).clients
    collector = Supervised("collector alone", [cli_exe(), "collector", "-c", str(path)],
                           log_path=path.parent / "collector.log" if log else None)
    collector.keep()
    proc = collector.proc
    assert proc is not None  # started by its first keep()
    try:
        leader = Keys(alone.farm.name).leader
        deadline = time.monotonic() + 60
        while not meter.hexists(leader, "holder"):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise InvariantViolation("bench redis-load: the collector alone did not lead")
            time.sleep(0.2)
        time.sleep(3.0)  # let start-up settle
        a = read(meter)
        time.sleep(idle_s)
        b = read(meter)
    finally:
        stop_all([proc], 30)
    return Window.between(a, b), max(0, b.clients - before)


def _pause_latency(client: RolloutClient, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds of each ``pause()`` (it returns once every worker has paused its replica)
    and from each ``resume()`` until every replica says it is no longer paused."""
    from queue_rollout.engines.sglang import SGLangClient

    replicas = [SGLangClient(w["replica"]) for w in client.registry.live().values()]
    pauses, resumes = [], []
    for _ in range(rounds):
        t = time.monotonic()
        client.pause()
        pauses.append(time.monotonic() - t)
        t = time.monotonic()
        client.resume()
        while any(r.server_info().get("paused") for r in replicas):
            time.sleep(0.002)
        resumes.append(time.monotonic() - t)
        time.sleep(0.2)
    return pauses, resumes


def _await_idle_rq_workers(client: redis.Redis, count: int, timeout: float = 120.0) -> None:
    from rq import Worker
    from rq.serializers import JSONSerializer

    deadline = time.monotonic() + timeout
    while len(Worker.all(connection=client, serializer=JSONSerializer)) < count:
        if time.monotonic() > deadline:
            raise InvariantViolation(f"bench redis-load: fewer than {count} RQ workers")
        time.sleep(0.5)


def _burst(client: RolloutClient, meter: redis.Redis, groups: int, tag: str = ""
           ) -> tuple[Window, int]:
    g, b = client.config.rollout.group_size, client.config.rollout.batch_size
    groups -= groups % b
    prompts = [{"id": f"burst{tag}-{i}", "prompt": "x", "member_lengths": [4] * g}
               for i in range(groups)]
    finished_before = client.ledger.counters().get("finished", 0)
    a = read(meter)
    client.submit(prompts)
    for _ in range(groups // b):
        batch = client.get_batch(timeout=300)
        client.train_step(batch, lambda _: None, pause=False)
    done = read(meter)
    finished = client.ledger.counters().get("finished", 0) - finished_before
    if finished != groups * g:
        raise InvariantViolation(f"bench redis-load: {finished} episodes of {groups * g}")
    return Window.between(a, done), groups * g


def _running(client: RolloutClient, meter: redis.Redis, slots: int, run_s: float
             ) -> tuple[Window, int]:
    g = client.config.rollout.group_size
    tokens = long_episode_tokens(client.config, run_s + 30.0)  # the window and the fill
    client.submit([{"id": f"long-{i}", "prompt": "x", "member_lengths": [tokens] * g}
                   for i in range(slots // g)])
    deadline = time.monotonic() + 60
    while client.status()["active_episodes"] < slots:
        if time.monotonic() > deadline:
            raise InvariantViolation("bench redis-load: the slots did not fill")
        time.sleep(0.2)
    time.sleep(1.0)
    a = read(meter)
    time.sleep(run_s)
    b = read(meter)
    return Window.between(a, b), slots


@dataclass
class PricedLeases:
    """Redis's counters over the priced lease work (:func:`_priced_leases`)."""

    renewals: Window  # every process's renewal calls, all its attempts in each
    renewals_alone: Window  # the same renewals, one attempt to a call
    renewal_count: int  # attempt renewals in each of the two
    extensions: Window  # the sweeps that extend attempts to their holder's lease
    extension_count: int


def _priced_leases(client: RolloutClient, meter: redis.Redis, config: Config, *,
                   rounds: int = RENEWAL_ROUNDS) -> PricedLeases:
    """The running attempts' records copied under a scratch farm's keys, their leases
    due, and the lease work done there by the ledger's own calls, *rounds* times each:
    every process's renewal of all its attempts, nothing new reported (one call each,
    then one call per attempt); then, a lease later each round, every holder's lease
    renewed and the sweep that extends every attempt to it. The scratch keys are
    deleted after."""
    running: dict[bytes, bytes] = {}  # attempt id -> its record
    # (worker, lease holder) -> each attempt's (id, seq, tokens, rid)
    held: dict[tuple[str, str], list[tuple[str, int, int, str]]] = {}
    for aid, raw in client.ledger.client.hgetall(client.ledger.keys.attempts).items():
        record = decode_attempt(raw)
        if record.state == "running" and record.worker is not None:
            running[aid] = raw
            held.setdefault((record.worker, record.holder or ""), []).append(
                (aid.decode(), record.seq or 0, record.tokens or 0, record.rid or ""))
    clock = [time.time()]
    scratch = Ledger(client.ledger.client, f"{config.farm.name}-priced-leases",
                     config.rollout, clock=lambda: clock[0])
    lease = float(config.timeouts.lease)

    def renew_all(n: int, together: bool) -> None:
        clock[0] += lease / 3  # a renewal period later: every other round writes leases
        for (worker, holder), attempts in held.items():
            renewals = [Renewal(aid, seq + n, tokens, rid, changed=False)
                        for aid, seq, tokens, rid in attempts]
            for call in [renewals] if together else [[r] for r in renewals]:
                scratch.renew(worker, lease, call, holder=holder)

    try:
        if running:
            scratch.client.hset(scratch.keys.attempts, mapping=running)
            scratch.client.zadd(scratch.keys.leases, dict.fromkeys(running, clock[0]))
        windows = []
        for together in (True, False):
            a = read(meter)
            for n in range(1, rounds + 1):
                renew_all(n, together)
            windows.append(Window.between(a, read(meter)))
        a = read(meter)
        for _ in range(rounds):
            clock[0] += lease  # every attempt's lease is due
            for worker, holder in held:
                scratch.renew(worker, lease, [], holder=holder)
            scratch.expire_leases()
        extensions = Window.between(a, read(meter))
        if (held_now := scratch.client.zcard(scratch.keys.leases)) != len(running):
            raise InvariantViolation(
                f"bench redis-load: {len(running) - held_now} of {len(running)} priced leases "
                "were not extended to their holder's: the extensions' price is not theirs")
    finally:
        if left := list(scratch.client.scan_iter(match=scratch.keys.prefix + "*")):
            scratch.client.delete(*left)
    return PricedLeases(windows[0], windows[1], rounds * len(running), extensions,
                        rounds * len(running))


def redis_load_text(r: dict[str, Any]) -> str:
    p = r["projection"]
    lines = [
        f"bench redis-load: {r['gpus']} GPUs x {r['slots_per_gpu']} slots"
        + (f", {r['replicas']} replica(s) following" if r["replicas"] else "")
        + (f", changes wait for {r['wait_replicas']}" if r["wait_replicas"] else "")
        + f" (empty Redis: {r['baseline_calls_per_s']:.2f} calls/s, "
        f"{r['baseline_core_pct']:.3f}% of a core, subtracted)",
        f"  the collector alone           {r['collector_calls_per_s']:10.2f} calls/s, "
        f"{r['collector_core_pct']:.4f}% of a core, {r['collector_connections']} connections "
        "(once per farm)",
        f"  the unit, one trivial call    {r['unit_us']:10.2f}   us of Redis CPU here (the median "
        "of " + ", ".join(f"{v:.2f}" for v in r["rounds_unit_us"])
        + f"; a quiet core runs about {r['quiet_core_units_per_s']:,.0f} a second)",
        f"  idle calls/s per GPU          {r['idle_calls_per_gpu_s']:10.2f}   (target <= 4)",
        f"  idle Redis core % per GPU     {r['idle_core_pct_per_gpu']:10.4f}   (target <= 0.02)"
        f" = {r['idle_units_per_gpu_s']:.2f} units/s (target <= 8)",
        f"  connections per GPU           {r['connections_per_gpu']:10.2f}   (target <= 20)",
        f"  commands per episode          {r['commands_per_episode']:10.2f}   (target <= 60)",
        f"  Redis CPU ms per episode      {r['redis_cpu_ms_per_episode']:10.4f}   "
        "(target <= 0.35; the median of "
        + ", ".join(f"{v:.3f}" for v in r["rounds_cpu_ms_per_episode"])
        + f") = {r['units_per_episode']:.2f} units (target <= 10)",
        f"  core % per running episode    {r['running_core_pct_per_episode']:10.6f}   "
        f"(the window's, noisy) = {r['running_units_per_episode_s']:.3f} units/s",
        f"  a running episode's lease     {r['lease_units_per_episode_s']:10.4f}   units/s "
        "(target <= 0.1): " + (
            f"one attempt's renewal {r['renewal_us']:.2f} us = {r['renewal_units']:.3f} units "
            f"({r['renewal_count']:,} priced, all of a process's in one call; "
            f"{r['renewal_alone_units']:.3f} units each in a call of its own), one per "
            f"{r['renewal_period_s']:g} s"
            + (f"; where renewals stop, the sweep's extension to the holder's lease "
               f"{r['extension_us']:.2f} us = {r['extension_units']:.3f} units"
               if r.get("extension_us") is not None else "")
            if r["renewal_us"] is not None else "the running window's (not priced)"),
        f"  projection, {p['gpus']} GPUs x {p['slots'] // p['gpus']} slots, "
        f"{p['episode_s']:g} s episodes ({p['episodes_per_s']:g} episodes/s): idle "
        f"{p['idle_core_pct']:.1f}% (the collector's included), "
        f"busy {p['busy_core_pct']:.1f}%, running leases "
        f"{p['running_core_pct']:.1f}%, sum {p['sum_core_pct']:.1f}% of one core; "
        f"{p['connections']} connections",
        *(f"  projection in units, {u['gpus']} GPUs x {u['slots_per_gpu']} slots, "
          f"{u['episode_s']:g} s episodes: idle {u['idle_units_per_s']:,}, busy "
          f"{u['busy_units_per_s']:,}, running {u['running_units_per_s']:,}, sum "
          f"{u['units_per_s']:,} units/s: {u['quiet_core_pct']:.1f}% of a quiet core "
          f"({u['this_core_pct']:.1f}% of this run's)" for u in r["projections_units"]),
        "  slow-log profile per episode, us (calls): " + ", ".join(
            f"{k} {v['usec']:g} ({v['calls']:g})"
            for k, v in list(r["episode_profile"].items())[:10]),
        "  commands per episode by name: " + ", ".join(
            f"{k} {v:g}" for k, v in list(r["episode_commands"].items())[:12]),
        "  idle calls/s per GPU by name: " + ", ".join(
            f"{k} {v:g}" for k, v in list(r["idle_commands_per_gpu_s"].items())[:8]),
        f"  pause barrier {r['pause_barrier_s'].get('median', float('nan')) * 1000:.1f} ms, "
        f"resume {r['resume_s'].get('median', float('nan')) * 1000:.1f} ms (medians)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # a quick look: python -m queue_rollout.lab.bench.redis_load
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        res = run_redis_load_bench(workdir=Path(tmp), idle_s=5, run_s=5,
                                   progress=lambda s: print(s, file=sys.stderr))
    print(json.dumps(res.as_json()))
