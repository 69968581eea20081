"""``queue-rollout up``: a whole local farm in the foreground until Ctrl-C.

An embedded Redis when ``farm.redis_url`` is empty (its URL written under
``state_dir`` for the other commands), ``engine.replicas`` simulated replicas when
``engine.kind = "sim"`` (else the replicas at ``engine.urls``), one worker per replica
(restarted with backoff if it dies, so every replica keeps someone to resolve its
doubt), and the collector with its metrics endpoint: the same processes a farm runs
across machines, started here as children, each in its own session: a terminal's
Ctrl-C reaches only `up`, which stops them in order.

Every log goes to a file under ``<state_dir>/logs`` (``up.log``, ``worker-<i>.log``,
``replica-<i>.log``, ``collector.log``); the terminal shows the farm's line, warnings
and what `up` waits for (with ``-v``: every log line as well). `up` says the farm is up
only once every worker has registered under its current process and the collector
leads; a child that exits with 2 (bad input or config, e.g. a port in use) stops the
farm (exit 2), and a farm not working within ``READY_S`` is stopped (exit 3), naming
what it waited for. Ctrl-C (or SIGTERM): the workers' running episodes get
``timeouts.shutdown_grace`` to finish, then the replicas and Redis stop; a second
Ctrl-C stops every process at once (what was running is redone, as after a crash).

A hard stop (SIGKILL) takes the children with it (:mod:`queue_rollout.procs`), and the
next `up` on the same ``state_dir`` first stops whatever of the recorded tree is left
(:mod:`.lineage`); its embedded Redis comes back on the port it had, so a trainer's
client rides through the restart, and the workers settle the attempts the old run left
running as their replicas' restart (new boot ids), whatever ports the replicas now have.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import redis

from queue_rollout.config import Config, write_config
from queue_rollout.errors import BarrierTimeout, ConfigError, QueueRolloutError
from queue_rollout.launch.lineage import Lineage
from queue_rollout.launch.owner import Owner
from queue_rollout.launch.targets import clear_targets, targets_path, write_up_targets
from queue_rollout.ledger.connection import connect_config, mask_url
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import Registry
from queue_rollout.procs import (
    Supervised,
    cli_exe,
    last_words,
    sim_engine_argv,
    spawn,
    stop_all,
)

log = logging.getLogger(__name__)
#: How long `up` waits for its farm to work before it stops it (exit 3): longer than a
#: worker waits for its replica, so what `up` reports is the worker's own message.
READY_S = 150.0
#: How often `up` says what it still waits for (from the first time on).
SAY_S = 10.0
#: Resident memory of one process `up` starts, in MB, as measured on Linux with CPython
#: 3.11 (`ps`'s RSS, shared pages counted in each): a worker's supervisor, an episode
#: process (its threads add little) or the collector; a simulated replica; the
#: embedded Redis, empty.
PYTHON_MB, SIM_REPLICA_MB, REDIS_MB = 38, 25, 15


def _replicas(config: Config) -> int:
    """The replicas `up` runs workers for: its own simulated ones, or ``engine.urls``."""
    e = config.engine
    return e.replicas if e.kind == "sim" else len(e.urls)


def _embedded_redis(config: Config) -> int:
    """The Redis servers `up` starts: the farm's (or on a farm of cells, the control
    one) without ``farm.redis_url``, and each cell's without its ``redis_url``."""
    return (0 if config.farm.redis_url else 1) + sum(not c.redis_url for c in config.cells)


def replica_cells(config: Config, replicas: int) -> list[str | None]:
    """The cell each replica's worker joins, in the replicas' order: none on a farm of
    one Redis; on a farm of cells, the replicas dealt in blocks by the cells' weights
    (the largest remainders take what rounding leaves), every cell at least one.
    ConfigError when there are fewer replicas than cells."""
    cells = config.cells
    if not cells:
        return [None] * replicas
    if replicas < len(cells):
        raise ConfigError(f"cells: {len(cells)} cells need a worker each, and `up` has "
                          f"{replicas} replica{'' if replicas == 1 else 's'} (more "
                          "engine.replicas, or fewer [[cells]])")
    total = sum(c.weight for c in cells)
    exact = [replicas * c.weight / total for c in cells]
    counts = [max(1, int(x)) for x in exact]
    while sum(counts) > replicas:  # the floors of one made too many: take from the fullest
        i = max((i for i in range(len(cells)) if counts[i] > 1),
                key=lambda i: counts[i] - exact[i])
        counts[i] -= 1
    while sum(counts) < replicas:
        counts[max(range(len(cells)), key=lambda i: exact[i] - counts[i])] += 1
    return [c.name for c, n in zip(cells, counts, strict=True) for _ in range(n)]


def footprint(config: Config) -> tuple[int, float]:
    """The processes `up` starts for *config* and about how many GB they hold resident:
    the embedded Redis servers (:func:`_embedded_redis`), the simulated replicas
    (``sim``), per replica a worker and its episode processes, and the collector."""
    e, replicas = config.engine, _replicas(config)
    python = 1 + replicas * (1 + e.episode_processes)
    sim = replicas if e.kind == "sim" else 0
    redis = _embedded_redis(config)
    return (python + sim + redis,
            (python * PYTHON_MB + sim * SIM_REPLICA_MB + redis * REDIS_MB) / 1000)


def shape_line(config: Config) -> str:
    """What `up` is about to start, and how to make it smaller."""
    e, replicas = config.engine, _replicas(config)
    processes, gb = footprint(config)
    knobs = ["engine.replicas"] if e.kind == "sim" else []
    knobs.append("engine.slots_per_replica")
    if e.episode_threads < e.slots_per_replica:
        knobs.append("more engine.threads_per_process (slots in one process)")
    return (f"{replicas} replica{'' if replicas == 1 else 's'} x {e.slots_per_replica} "
            f"slot{'' if e.slots_per_replica == 1 else 's'} in {processes} processes, "
            f"about {gb:.1f} GB; smaller: {', '.join(knobs)} in a config (-c farm.toml)")


def start_sim_engines(config: Config, config_path: Path,
                      request_log_dir: Path | None = None,
                      log_dir: Path | None = None) -> tuple[list[Supervised], list[str]]:
    """``engine.replicas`` simulated replicas (restartable), and their URLs; each one
    appends its requests to ``request_log_dir/replica-<i>.jsonl`` when that is given,
    and its log to ``log_dir/replica-<i>.log``."""
    e = config.engine
    engines: list[Supervised] = []
    urls: list[str] = []
    for i in range(e.replicas):
        extra = ["-c", str(config_path)]
        if request_log_dir is not None:
            extra += ["--request-log", str(request_log_dir / f"replica-{i}.jsonl")]
        log_path = None if log_dir is None else log_dir / f"replica-{i}.log"
        # the engine binds a free port itself and says which: no port can be taken
        # between choosing and binding it; a restart asks for the same port again
        with contextlib.ExitStack() as files:
            stderr = None if log_path is None else files.enter_context(log_path.open("ab"))
            proc = spawn([*sim_engine_argv(e, 0), *extra], stdout=subprocess.PIPE,
                         stderr=stderr, text=True, start_new_session=True)
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://[\d.]+:(\d+)", line)
        if not match:
            proc.kill()
            stop_all((m.proc for m in engines if m.proc), 10)
            raise QueueRolloutError(f"sim replica {i} did not start: {line.strip()!r}")
        port = int(match.group(1))
        engines.append(Supervised(f"sim replica {i}", [*sim_engine_argv(e, port), *extra],
                                  proc=proc, log_path=log_path, new_session=True))
        urls.append(f"http://127.0.0.1:{port}")
    return engines, urls


@dataclass
class LocalFarm:
    """A farm's processes on this machine: Redis (embedded when the config names none),
    replicas, one worker per replica and the collector (``queue-rollout collector``,
    which serves the metrics), each restarted with backoff when it dies. Replicas are
    ``engine.urls`` for SGLang, simulated ones started here for ``sim``, or the
    *engine_urls* given (replicas someone else runs, e.g. shared by benchmark runs).
    With *log_dir*, every child's log goes to a file there (``worker-<i>.log``,
    ``replica-<i>.log``, ``collector.log``) instead of this process's stderr; with
    *request_log_dir*, each simulated replica appends its requests there. On a farm of
    cells, each cell without a ``redis_url`` gets a Redis of its own under
    ``<state_dir>/cells/<name>`` and the replicas' workers are dealt over the cells
    (:func:`replica_cells`)."""

    config: Config
    config_path: Path
    engine_urls: list[str] | None = None
    log_dir: Path | None = None
    request_log_dir: Path | None = None
    redis: EmbeddedRedis | None = None
    cell_redis: list[EmbeddedRedis] = field(default_factory=list)  # the cells' it started
    engines: list[Supervised] = field(default_factory=list)
    workers: list[Supervised] = field(default_factory=list)
    collector: Supervised | None = None
    clock: Callable[[], float] = time.monotonic  # wait_ready's
    unready: list[str] = field(default_factory=list)  # what wait_ready last waited for
    replica_urls: list[str] = field(default_factory=list)  # what start() found
    lineage: Lineage | None = None  # where the children are recorded (``up``'s farm)

    def start(self) -> str:
        c = self.config
        url = c.farm.redis_url
        # each replica's cell before any server starts (fewer replicas than cells: refused)
        homes = replica_cells(c, len(self.engine_urls) if self.engine_urls is not None
                              else _replicas(c))
        if self.lineage is not None:  # before any port is bound: nothing of the last run
            self.lineage.stop_leftovers()
        if not url:
            # a farm's own Redis keeps its port: clients started before a restart go on
            self.redis = EmbeddedRedis(c.farm.state_dir, keep_port=self.lineage is not None)
            url = self.redis.start()
            # the children find this Redis through the config we hand them
            self.config = msgspec.structs.replace(
                c, farm=msgspec.structs.replace(c.farm, redis_url=url))
        self.config = msgspec.structs.replace(self.config, cells=[
            cell if cell.redis_url else msgspec.structs.replace(
                cell, redis_url=self._start_cell_redis(c.for_cell(cell.name)))
            for cell in self.config.cells])
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        write_config(self.config_path, self.config)
        urls = self.replica_urls = self._replica_urls()
        for gpu, (engine_url, cell) in enumerate(zip(urls, homes, strict=True)):
            self.workers.append(Supervised(
                f"worker gpu{gpu}", [cli_exe(), "worker", "--gpu", str(gpu), "--engine-url",
                                     engine_url, "-c", str(self.config_path),
                                     *(["--cell", cell] if cell else [])],
                log_path=self._log(f"worker-{gpu}"), new_session=True))
        self.collector = Supervised("collector",
                                    [cli_exe(), "collector", "-c", str(self.config_path)],
                                    log_path=self._log("collector"), new_session=True)
        self._record()
        return url

    def _start_cell_redis(self, seen: Config) -> str:
        """A Redis for the cell *seen* (its view, :meth:`Config.for_cell`) under its own
        state_dir, where the other commands find its URL; the same port on a restart."""
        server = EmbeddedRedis(seen.farm.state_dir, keep_port=self.lineage is not None)
        self.cell_redis.append(server)
        return server.start()

    def ledgers(self) -> list[Config]:
        """The farm as each ledger's server sees it: every cell's view on a farm of
        cells, else the farm's one."""
        return [self.config.for_cell(c.name) for c in self.config.cells] or [self.config]

    def _log(self, name: str) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"{name}.log"

    def _replica_urls(self) -> list[str]:
        e = self.config.engine
        if self.engine_urls is not None:
            return list(self.engine_urls)
        if e.kind != "sim":
            if not e.urls:
                raise ConfigError(f"engine.urls: `up` with engine.kind = \"{e.kind}\" needs "
                                  "the replicas' URLs (or use `queue-rollout node`)")
            return list(e.urls)
        if self.request_log_dir is not None:
            self.request_log_dir.mkdir(parents=True, exist_ok=True)
        self.engines, urls = start_sim_engines(self.config, self.config_path,
                                               request_log_dir=self.request_log_dir,
                                               log_dir=self.log_dir)
        return urls

    def children(self) -> list[Supervised]:
        return [*self.engines, *self.workers, *([self.collector] if self.collector else [])]

    def keep(self) -> None:
        for m in self.children():
            m.keep()
        self._record()

    def _record(self) -> None:
        """Write the children (and the embedded Redis) down, for the next run's start."""
        if self.lineage is not None:
            self.lineage.record([*(m.proc for m in self.children()),
                                 *(r.proc for r in (self.redis, *self.cell_redis) if r)])

    def not_ready(self, live: dict[str, dict[str, Any]], leader: str) -> list[str]:
        """What keeps the farm from working now, given the live workers' records and the
        collector that leads: each worker that is not running and registered under its
        current process (one that exited, or was restarted, is not ready until it
        registers again), and the collector until it runs and leads."""
        pids = {record.get("pid") for record in live.values()}
        waiting = [self._why(w, "not registered yet") for w in self.workers
                   if not (_running(w) and w.proc is not None and w.proc.pid in pids)]
        c = self.collector
        if c is not None and not (_running(c) and c.proc is not None
                                  and leader == f"{socket.gethostname()}-{c.proc.pid}"):
            waiting.append(self._why(c, "not leading yet"))
        return waiting

    @staticmethod
    def _why(child: Supervised, state: str) -> str:
        """``worker gpu0 (not registered yet; exited 2 times, last with 3; it said: ...)``"""
        parts = [state]
        if child.exits:
            parts.append(f"exited {child.exits} time{'s' if child.exits > 1 else ''}, last "
                         f"with {child.last_exit}")
        said = last_words(child.log_path)
        if said:
            parts.append(f"it said: {said}")
        return f"{child.name} ({'; '.join(parts)})"

    def wait_ready(self, stop: threading.Event, timeout: float = 120.0, *,
                   say: Callable[[str], None] | None = None, say_every: float = SAY_S,
                   poll_s: float = 0.2) -> bool:
        """Until every worker has registered and the collector leads (so `up` prints
        its line when the farm works), keeping the children running meanwhile; False if
        *stop* was set or *timeout* passed first (``unready`` then names what was not
        ready). With *say*, what it still waits for is said every *say_every* seconds.
        A child that exits on bad input raises :class:`~queue_rollout.procs.ChildRefused`."""
        client = connect_config(self.config)
        keys = Keys(self.config.farm.name)
        registries: list[Registry] = []
        started = self.clock()
        say_at = started + say_every
        try:
            for seen in self.ledgers():  # the farm's, or every cell's
                registries.append(Registry(client if not self.config.cells
                                           else connect_config(seen),
                                           keys, self.config.timeouts.lease))
            while not stop.is_set():
                holder = client.hget(keys.leader, "holder")
                live = {f"{i}/{worker}": record for i, registry in enumerate(registries)
                        for worker, record in registry.live().items()}
                self.unready = self.not_ready(live, holder.decode() if holder else "")
                if not self.unready:
                    return True
                now = self.clock()
                if now - started >= timeout:
                    break
                if say is not None and now >= say_at:
                    say(f"waiting {now - started:.0f} s for: " + "; ".join(self.unready))
                    say_at = now + say_every
                self.keep()
                stop.wait(poll_s)
        finally:
            for registry in registries:  # the cells' own clients; the control one last
                if registry.client is not client:
                    registry.client.close()
            client.close()
        if not stop.is_set() and say is None:  # (with *say*, the caller says it)
            log.warning("the farm was not ready within %.0fs: %s", timeout,
                        "; ".join(self.unready))
        return False

    def running_episodes(self) -> int | None:
        """The farm's running episodes (the ledgers' counts, every cell's on a farm of
        cells); None when a Redis does not answer."""
        running = 0
        try:
            for seen in self.ledgers():
                client = connect_config(seen)
                try:
                    running += int(client.hget(Keys(seen.farm.name).counters, "running") or 0)
                finally:
                    client.close()
        except (QueueRolloutError, redis.RedisError):
            return None
        return running

    def stop(self, now: threading.Event | None = None) -> None:
        """The workers (their running episodes get ``timeouts.shutdown_grace``) and the
        collector together, then the replicas, then Redis; once *now* is set (a second
        Ctrl-C), every process still there is killed at once."""
        stop_all([m.proc for m in (*self.workers, self.collector) if m and m.proc],
                 self.config.timeouts.shutdown_grace + 30, now=now)
        stop_all((m.proc for m in self.engines if m.proc), 10, now=now)
        for server in (*self.cell_redis, *([self.redis] if self.redis else [])):
            server.stop()


def _running(child: Supervised) -> bool:
    return child.proc is not None and child.proc.poll() is None


def run_up(config: Config, *, stop: threading.Event | None = None,
           request_log_dir: Path | None = None, verbose: bool | None = None,
           ready_timeout: float = READY_S) -> int:
    """``queue-rollout up`` until *stop* (SIGTERM, Ctrl-C). *verbose* (``-v``): every log
    line on the terminal too (None: when the root logger takes DEBUG, as ``-v`` sets)."""
    stop = stop or threading.Event()
    now = threading.Event()  # a second Ctrl-C: stop every process at once
    stopping = threading.Event()
    if verbose is None:
        verbose = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, frame: object) -> None:
            if stop.is_set() or stopping.is_set():
                now.set()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    name = config.farm.name
    state = Path(config.farm.state_dir)
    logs = state / "logs"

    def say(text: str) -> None:
        print(f"farm {name}: {text}", file=sys.stderr, flush=True)

    with (Owner(state / "farm.lock", f"farm {name} is already up"),
          logs_to(logs / "up.log", verbose=verbose),
          LogFollower(logs, skip={"up.log"}) if verbose else contextlib.nullcontext()):
        farm = LocalFarm(config, state / "up.toml", log_dir=logs,
                         request_log_dir=request_log_dir, lineage=Lineage(state))
        say(shape_line(config))
        try:
            url = farm.start()
            write_up_targets(farm.config, farm.replica_urls)  # Prometheus's file_sd
            if farm.wait_ready(stop, ready_timeout, say=say):
                cells = "".join(f", cell {c.name} {mask_url(c.redis_url)}"
                                for c in farm.config.cells)
                print(f"farm {name} up: redis {mask_url(url)}{cells}, {len(farm.workers)} "
                      "workers, "
                      f"metrics http://{config.metrics.host}:{config.metrics.port}/metrics; "
                      f"logs in {logs}; Ctrl-C stops it", flush=True)
                while not stop.wait(0.5):
                    farm.keep()
            elif not stop.is_set():
                raise BarrierTimeout(
                    f"farm {name} was not ready within {ready_timeout:g} s, waiting for: "
                    f"{'; '.join(farm.unready)}; the logs are in {logs}")
            else:
                say("stopped before it was ready, waiting for: " + "; ".join(farm.unready))
        except QueueRolloutError as exc:  # the reason first, then what stopping waits for
            say(f"stopping: {exc}")
            raise
        finally:
            stopping.set()
            clear_targets(targets_path(config))
            _stop_farm(farm, now, say)
    print(f"farm {name} stopped", flush=True)
    return 0


def _stop_farm(farm: LocalFarm, now: threading.Event, say: Callable[[str], None]) -> None:
    """Stop *farm*, saying what it waits for and that a second Ctrl-C stops it now."""
    if any(_running(w) for w in farm.workers) and not now.is_set():
        grace = farm.config.timeouts.shutdown_grace
        running = farm.running_episodes()
        if running == 0:
            say("stopping: no episode is running")
        else:
            what = ("the running episodes" if running is None else
                    f"{running} running episode{'' if running == 1 else 's'}")
            say(f"stopping: waiting up to {grace} s for {what} to finish; Ctrl-C again to "
                "stop now")
    farm.stop(now)
    if now.is_set():
        say("stopped now: what was running is redone once its leases expire, as after a "
            "crash")


@contextlib.contextmanager
def logs_to(path: Path, *, verbose: bool) -> Iterator[None]:
    """While it lasts, this process's log also goes to *path* (INFO and up; DEBUG with
    *verbose*), and the terminal's handler shows only warnings unless *verbose*."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    file = logging.FileHandler(path, encoding="utf-8")
    file.setLevel(logging.DEBUG if verbose else logging.INFO)
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    terminal = [(h, h.level) for h in root.handlers if type(h) is logging.StreamHandler]
    level = root.level
    if not verbose:
        for handler, was in terminal:
            handler.setLevel(max(was, logging.WARNING))
    if level == logging.NOTSET or level > logging.INFO:
        root.setLevel(logging.INFO)
    root.addHandler(file)
    try:
        yield
    finally:
        root.removeHandler(file)
        file.close()
        root.setLevel(level)
        for handler, was in terminal:
            handler.setLevel(was)


class LogFollower:
    """With ``-v``: every line the children add to their logs in *folder* is copied to
    *out* (stderr), after the log's name (``worker-0: ...``); what the files held
    before is not."""

    def __init__(self, folder: Path, *, skip: set[str] | None = None,
                 out: Any = None, every_s: float = 0.25) -> None:
        self.folder, self.skip, self.every_s = folder, skip or set(), every_s
        self.out = out
        self._offsets: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="log-follower")

    def __enter__(self) -> LogFollower:
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in self.folder.glob("*.log"):
            self._offsets[path] = path.stat().st_size
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.drain()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.drain()

    def drain(self) -> None:
        out = self.out or sys.stderr
        for path in sorted(self.folder.glob("*.log")):
            if path.name in self.skip:
                continue
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            whole = data[:data.rfind(b"\n") + 1]  # whole lines only: the rest next time
            if not whole:
                continue
            self._offsets[path] = offset + len(whole)
            for line in whole.decode(errors="replace").splitlines():
                out.write(f"{path.stem}: {line}\n")
            out.flush()
