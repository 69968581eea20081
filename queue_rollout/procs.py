"""Child processes: started so that they die with their parent, stopped cleanly, and
kept running when supervised.

Every process the package starts goes through :func:`spawn`. On Linux the child asks
the kernel for a signal when its parent dies (``PR_SET_PDEATHSIG``): SIGTERM, so that a
launcher killed with SIGKILL takes its whole tree with it, each child stopping as on
SIGTERM and, doing so, stopping its own children (a worker that finds itself orphaned
stops at once rather than waiting out its grace); SIGKILL for a child with nothing to
tidy (an episode process: what it ran is redone as after a crash). The signal fires when
the *thread* that started the child ends, so children are started from a thread that
lives as long as they should: the launchers' main loops.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queue_rollout.config import EngineConfig
from queue_rollout.errors import ConfigError

log = logging.getLogger(__name__)
HEALTHY_S = 10.0  # a child that ran this long before it died restarts without backoff
#: The CLI's exit status for bad input or config: a supervised child that exits with it
#: is not restarted (it would only be refused again).
BAD_INPUT_EXIT = 2


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# resolved now: the child calls it between fork and exec, where a symbol lookup could
# wait on a loader lock that another thread of the parent held at the fork
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(parent: int, signum: int = signal.SIGTERM) -> bool:
    """Ask for *signum* when the parent dies; False if *parent* (the pid that started
    this process) is already gone, having died before the request was made."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    return os.getppid() == parent


def _exit_unless_parent(parent: int, signum: int) -> None:
    """In the child between fork and exec: never start the program for a dead parent."""
    if not die_with_parent(parent, signum):
        os._exit(1)


def spawn(argv: list[str], *, death_signal: int = signal.SIGTERM,
          **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen)`` for a child that gets *death_signal* when this
    process dies (or the thread that calls this: see the module's text)."""
    parent = os.getpid()
    # preexec_fn with threads about: the function takes no lock (one system call
    # through a pointer resolved at import, getppid, _exit)
    return subprocess.Popen(argv, preexec_fn=lambda: _exit_unless_parent(parent, death_signal),  # noqa: PLW1509
                            **popen)


def orphaned(parent: int) -> bool:
    """This process's parent is no longer *parent* (the one that started it died)."""
    return os.getppid() != parent


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); None if
    the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """When process *pid* started, in clock ticks since the machine booted (``stat``'s
    22nd field): with the pid, it names one process across pid reuse. None if gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) of process *pid*, of its children it has waited
    for, and of its live descendants; 0 for a process that is gone."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    own = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(tree_cpu_seconds(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in task.read_text().split()]
    return out


def running(pid: int) -> bool:
    """Process *pid* exists and is not a zombie."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def session_of(pid: int) -> int | None:
    """The session id of process *pid* (None if gone)."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def port_holder(port: int) -> str:
    """Who listens on TCP *port* of this machine, as far as ``/proc`` tells this user:
    ``pid 123 (redis-server *:6400)``, or "" when it cannot tell."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if (len(fields) > 9 and fields[3] == "0A"  # LISTEN
                    and int(fields[1].rsplit(":", 1)[1], 16) == port):
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return ""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                return f"pid {pid} ({cmd.decode(errors='replace').strip()[:120]})"
        except OSError:
            continue
    return ""


def cli_exe() -> str:
    """The ``queue-rollout`` command of this installation (beside this Python)."""
    return shutil.which("queue-rollout", path=str(Path(sys.executable).parent)) or "queue-rollout"


def sim_engine_argv(e: EngineConfig, port: int) -> list[str]:
    """The command line of a simulated replica with *e*'s model settings."""
    return [cli_exe(), "sim-engine", "--port", str(port), "--slots", str(e.slots_per_replica),
            "--step-ms", str(e.step_ms), "--step-ms-per-request", str(e.step_ms_per_request),
            "--prefill-tokens-per-s", str(e.prefill_tokens_per_s),
            "--chunked-prefill-size", str(e.chunked_prefill_size),
            "--max-total-tokens", str(e.max_total_tokens)]


def stop_all(procs: Iterable[subprocess.Popen[Any]], timeout: float, *,
             now: threading.Event | None = None, poll_s: float = 0.05) -> None:
    """SIGTERM every live process, wait for all of them together up to *timeout*, then
    SIGKILL the ones still there; as soon as *now* is set (a second Ctrl-C), SIGKILL
    them at once. A process that leads its own process group (``new_session``) is
    killed with its group: its own children go with it."""
    live = [p for p in procs if p.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while live:
        if time.monotonic() >= deadline or (now is not None and now.is_set()):
            for proc in live:
                kill_tree(proc)
            for proc in live:
                proc.wait()
            return
        if now is not None:
            now.wait(poll_s)
        else:
            time.sleep(poll_s)
        live = [p for p in live if p.poll() is None]


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL *proc*, and its process group when it leads one (a child started with
    ``new_session``: its episode processes are in its group)."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
            return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def log_tail(path: Path | None, lines: int = 10) -> str:
    """The last *lines* lines of the log at *path* ("" when there is none)."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
        return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])


def last_words(path: Path | None) -> str:
    """What a child that exited said last: its ``queue-rollout: ...`` line (the CLI's
    one-line error) if the end of its log has one, else its last line ("" without)."""
    said = [line.strip() for line in log_tail(path, 20).splitlines() if line.strip()]
    for line in reversed(said):
        if line.startswith("queue-rollout: "):
            return line.removeprefix("queue-rollout: ")
    return said[-1] if said else ""


class ChildRefused(ConfigError):
    """A supervised child exited with ``BAD_INPUT_EXIT`` (bad input or config, e.g. a
    port in use): it is not restarted, since it would only be refused again."""


@dataclass
class Supervised:
    """A child that is restarted with backoff (0.5 s doubling to 30 s) when it exits; a
    child that ran for ``HEALTHY_S`` or longer before it exited starts the backoff over
    (a crash loop backs off, an occasional death does not add up). A child that exits
    with ``BAD_INPUT_EXIT`` is not restarted: :meth:`keep` raises :class:`ChildRefused`
    with what it said. With ``new_session`` it runs in its own session (and process
    group), so a terminal's Ctrl-C reaches only its launcher, which stops it in order,
    and a kill reaches its children too."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    log_path: Path | None = None  # its stderr goes here (appended) instead of ours
    before_start: Callable[[Supervised], None] | None = None  # e.g. a new boot id in argv
    proc: subprocess.Popen[Any] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = 0.0
    clock: Callable[[], float] = time.monotonic
    new_session: bool = False
    exits: int = 0  # how often it exited, in all
    last_exit: int | None = None  # its last exit status
    death_signal: int = signal.SIGTERM  # what it gets when its launcher dies

    def keep(self) -> None:
        now = self.clock()
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:
            self.exits += 1
            self.last_exit = self.proc.returncode
            if self.proc.returncode == BAD_INPUT_EXIT:
                self.proc, self.next_start = None, math.inf  # never started again
                said = last_words(self.log_path)
                where = f" (its log: {self.log_path})" if self.log_path else ""
                raise ChildRefused(f"{self.name} exited with {BAD_INPUT_EXIT} (bad input or "
                                   f"config), not restarted{': ' + said if said else ''}"
                                   f"{where}")
            said = log_tail(self.log_path)
            log.warning("%s exited (%s); restarting%s", self.name, self.proc.returncode,
                        f"; the end of {self.log_path}:\n{said}" if said else "")
            if now - self.started_at >= HEALTHY_S:
                self.restarts = 0
            self.restarts += 1
            self.next_start = now + min(30.0, 0.5 * 2 ** min(self.restarts, 6))
            self.proc = None
        if now >= self.next_start:
            if self.before_start is not None:
                self.before_start(self)
            if self.log_path is None:
                self.proc = spawn(self.argv, env=self.env, stdout=subprocess.DEVNULL,
                                  start_new_session=self.new_session,
                                  death_signal=self.death_signal)
            else:
                with self.log_path.open("ab") as log_file:
                    self.proc = spawn(self.argv, env=self.env, stdout=subprocess.DEVNULL,
                                      stderr=log_file, start_new_session=self.new_session,
                                      death_signal=self.death_signal)
            self.started_at = now
            log.info("%s started (pid %d)", self.name, self.proc.pid)
