"""``queue-rollout up``: a whole local farm in the foreground until Ctrl-C.

An embedded Redis when ``farm.redis_url`` is empty (its URL written under
``state_dir`` for the other commands), ``engine.replicas`` simulated replicas when
``engine.kind = "sim"`` (else the replicas at ``engine.urls``), one worker per replica
(restarted with backoff if it dies, so every replica keeps someone to resolve its
doubt), and the collector with its metrics endpoint: the same processes a farm runs
across machines, started here as children.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from queue_rollout.config import Config, write_config
from queue_rollout.errors import ConfigError, QueueRolloutError
from queue_rollout.launch.owner import Owner
from queue_rollout.ledger.connection import connect_config, mask_url
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import Registry
from queue_rollout.procs import Supervised, cli_exe, sim_engine_argv, spawn, stop_all

log = logging.getLogger(__name__)


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
        argv = [*sim_engine_argv(e, 0), "-c", str(config_path)]
        if request_log_dir is not None:
            argv += ["--request-log", str(request_log_dir / f"replica-{i}.jsonl")]
        log_path = None if log_dir is None else log_dir / f"replica-{i}.log"
        # the engine binds a free port itself and says which: no port can be taken
        # between choosing and binding it; a restart asks for the same port again
        with contextlib.ExitStack() as files:
            stderr = None if log_path is None else files.enter_context(log_path.open("ab"))
            proc = spawn(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://[\d.]+:(\d+)", line)
        if not match:
            proc.kill()
            stop_all((m.proc for m in engines if m.proc), 10)
            raise QueueRolloutError(f"sim replica {i} did not start: {line.strip()!r}")
        argv[3] = match.group(1)
        engines.append(Supervised(f"sim replica {i}", argv, proc=proc, log_path=log_path))
        urls.append(f"http://127.0.0.1:{match.group(1)}")
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
    *request_log_dir*, each simulated replica appends its requests there."""

    config: Config
    config_path: Path
    engine_urls: list[str] | None = None
    log_dir: Path | None = None
    request_log_dir: Path | None = None
    redis: EmbeddedRedis | None = None
    engines: list[Supervised] = field(default_factory=list)
    workers: list[Supervised] = field(default_factory=list)
    collector: Supervised | None = None

    def start(self) -> str:
        c = self.config
        url = c.farm.redis_url
        if not url:
            self.redis = EmbeddedRedis(c.farm.state_dir)
            url = self.redis.start()
            # the children find this Redis through the config we hand them
            self.config = msgspec.structs.replace(
                c, farm=msgspec.structs.replace(c.farm, redis_url=url))
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        write_config(self.config_path, self.config)
        urls = self._replica_urls()
        for gpu, engine_url in enumerate(urls):
            self.workers.append(Supervised(
                f"worker gpu{gpu}", [cli_exe(), "worker", "--gpu", str(gpu), "--engine-url",
                                     engine_url, "-c", str(self.config_path)],
                log_path=self._log(f"worker-{gpu}")))
        self.collector = Supervised("collector",
                                    [cli_exe(), "collector", "-c", str(self.config_path)],
                                    log_path=self._log("collector"))
        return url

    def _log(self, name: str) -> Path | None:
        return None if self.log_dir is None else self.log_dir / f"{name}.log"

    def _replica_urls(self) -> list[str]:
        e = self.config.engine
        if self.engine_urls is not None:
            return list(self.engine_urls)
        if e.kind == "sglang":
            if not e.urls:
                raise ConfigError("engine.urls: `up` with engine.kind = \"sglang\" needs the "
                                  "replicas' URLs (or use `queue-rollout node`)")
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

    def wait_ready(self, stop: threading.Event, timeout: float = 120.0) -> bool:
        """Until every worker has registered and the collector leads (so `up` prints
        its line when the farm works); False if that took longer than *timeout*."""
        client = connect_config(self.config)
        keys = Keys(self.config.farm.name)
        registry = Registry(client, keys, self.config.timeouts.lease)
        deadline = time.monotonic() + timeout
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                if (len(registry.live()) >= len(self.workers)
                        and client.hexists(keys.leader, "holder")):
                    return True
                self.keep()
                time.sleep(0.2)
        finally:
            client.close()
        log.warning("the farm was not ready within %.0fs (workers or collector)", timeout)
        return False

    def stop(self) -> None:
        stop_all((m.proc for m in self.workers if m.proc), self.config.timeouts.shutdown_grace + 30)
        stop_all((m.proc for m in (self.collector,) if m and m.proc), 30)
        stop_all((m.proc for m in self.engines if m.proc), 10)
        if self.redis is not None:
            self.redis.stop()


def run_up(config: Config, *, stop: threading.Event | None = None,
           request_log_dir: Path | None = None) -> int:
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    state = Path(config.farm.state_dir)
    with Owner(state / "farm.lock", f"farm {config.farm.name} is already up"):
        farm = LocalFarm(config, state / "up.toml", request_log_dir=request_log_dir)
        try:
            url = farm.start()
            farm.wait_ready(stop)
            print(f"farm {config.farm.name} up: redis {mask_url(url)}, {len(farm.workers)} "
                  f"workers, metrics http://{config.metrics.host}:{config.metrics.port}/metrics;"
                  " Ctrl-C stops it", flush=True)
            while not stop.wait(0.5):
                farm.keep()
        finally:
            farm.stop()
    return 0
