"""Helpers for the tests: waiting, trivial prompts, a small `queue-rollout up` farm in
the background, free ports, process trees. (The manual clock is the virtual farm's:
:class:`queue_rollout.virtual.clock.ManualClock`.)"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from queue_rollout.ledger.embedded import free_port
from queue_rollout.procs import cli_exe

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, what: str = "condition",
             tick: Callable[[], object] | None = None, every: float = 0.1) -> T:
    """Poll *predicate* until it returns something true and return that; fail the test
    (AssertionError naming *what*) after *timeout* seconds. *tick* runs between polls."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if tick is not None:
            tick()
        time.sleep(every)
    return value


def trivial_prompts(n: int, prefix: str = "p") -> list[tuple[str, bytes]]:
    """*n* (id, prompt JSON) pairs with ids ``p0``, ``p1``, ..."""
    return [(f"{prefix}{i}", b'{"prompt": "x"}') for i in range(n)]


def write_up_farm(path: Path, name: str, state: Path, *, rollout: str, slots: int,
                  metrics_port: int, extra: str = "", step_ms_per_request: float = 0.0) -> Path:
    """A farm config for `up`: 2 sim replicas of *slots* slots each, fast decoding."""
    path.write_text(f'[farm]\nname = "{name}"\nstate_dir = "{state}"\n'
                    f"[rollout]\n{rollout}\n{extra}"
                    f"[engine]\nreplicas = 2\nslots_per_replica = {slots}\nstep_ms = 0.5\n"
                    f"step_ms_per_request = {step_ms_per_request}\n"
                    f"[metrics]\nport = {metrics_port}\n[timeouts]\nshutdown_grace = 2\n")
    return path


@contextlib.contextmanager
def farm_up(toml: Path) -> Iterator[str]:
    """`queue-rollout up` in the background, yielding the line it announces itself
    with; Ctrl-C at the end must stop it cleanly."""
    up = subprocess.Popen([cli_exe(), "up", "-c", str(toml)], stdout=subprocess.PIPE,
                          text=True)
    try:
        yield up.stdout.readline()
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0


def free_ports(n: int) -> int:
    """A port p with p .. p+n-1 all free just now (node's replica i uses base_port + i)."""
    for _ in range(50):
        base = free_port()
        try:
            for port in range(base, base + n):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")



def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now (from /proc)."""
    parent: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parent[int(p)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parent


def children(pid: int) -> list[int]:
    """The processes whose parent is *pid*."""
    return [child for child, parent in _parents().items() if parent == pid]


def process_tree(root: int) -> set[int]:
    """*root* and every process descending from it."""
    parent = _parents()
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return tree
