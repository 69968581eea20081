"""What a launcher started, recorded under its state directory, so that the next launcher
on the same directory stops what a hard stop left running before it binds a port.

``up`` and ``node`` start every child in a session of its own and record each one here
(``<dir>/procs.json``: the machine's boot, and each child's pid and start time, which
together name one process across pid reuse) whenever the set of their children changes.
Their children die with them by mechanism (:mod:`queue_rollout.procs`); this is the
second line: on start, a launcher stops every process left of the recorded tree (a
recorded child still alive under its start time, and anything still in that child's
session that started after it), SIGTERM first, SIGKILL for what lingers, and waits until
they are gone. The new farm then starts with no process of the old one able to write to
it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from queue_rollout.errors import FarmBusy
from queue_rollout.procs import running, session_of, start_time

log = logging.getLogger(__name__)
#: How long leftovers get to stop on SIGTERM before SIGKILL, and then to be gone.
TERM_S = 5.0
KILL_S = 10.0


def machine_boot() -> str:
    """This machine's boot id: a recorded pid means nothing after a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class Lineage:
    """The record at ``<folder>/procs.json`` of the processes a launcher started."""

    def __init__(self, folder: Path, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(folder) / "procs.json"
        self.sleep, self.clock = sleep, clock
        self._written: frozenset[int] = frozenset()

    def record(self, procs: Iterable[subprocess.Popen[Any] | None]) -> None:
        """Write the live ones of *procs* down, when they are not the ones written last."""
        pids = frozenset(p.pid for p in procs if p is not None and p.poll() is None)
        if pids == self._written:
            return
        children = [{"pid": pid, "start": start} for pid in sorted(pids)
                    if (start := start_time(pid)) is not None]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"boot": machine_boot(), "children": children}) + "\n")
        tmp.replace(self.path)
        self._written = pids

    def leftovers(self) -> set[int]:
        """The processes of the recorded tree still running."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return set()
        if record.get("boot") != machine_boot():
            return set()
        children = {int(c["pid"]): int(c["start"]) for c in record.get("children", [])}
        found: set[int] = set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            p = int(pid)
            if p == os.getpid() or (started := start_time(p)) is None or not running(p):
                continue
            if children.get(p) == started:
                found.add(p)
            elif ((sid := session_of(p)) in children and started >= children[sid]
                  and start_time(sid) in (None, children[sid])):
                # in a recorded child's session, started after it (and that session is
                # still the child's: its leader is the child or gone, not a reused pid)
                found.add(p)
        return found

    def stop_leftovers(self) -> set[int]:
        """Stop what is left of the recorded tree (SIGTERM, then SIGKILL after
        :data:`TERM_S`) and wait until it is gone; returns the pids it found. Raises
        :class:`FarmBusy` naming those still there after :data:`KILL_S` more."""
        found = self.leftovers()
        if not found:
            return found
        log.warning("stopping %d process%s a previous run left (pids %s)", len(found),
                    "" if len(found) == 1 else "es",
                    ", ".join(map(str, sorted(found))))
        self._signal(found, signal.SIGTERM)
        left = self._wait(found, TERM_S)
        if left:
            self._signal(left, signal.SIGKILL)
            left = self._wait(left, KILL_S)
        if left:
            raise FarmBusy(f"processes of the farm's previous run would not stop: pids "
                           f"{', '.join(map(str, sorted(left)))} (recorded in {self.path})")
        return found

    @staticmethod
    def _signal(pids: set[int], signum: int) -> None:
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _wait(self, pids: set[int], seconds: float) -> set[int]:
        deadline = self.clock() + seconds
        while (left := {p for p in pids if running(p)}) and self.clock() < deadline:
            self.sleep(0.05)
        return left
