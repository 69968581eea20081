"""One owner per farm directory: a lock file that a launcher holds for as long as it runs.

``up`` owns ``<state_dir>/farm.lock`` (it opens the farm's embedded Redis and publishes
its ``redis.url``), ``demo`` owns ``<state_dir>/demo.lock`` (its folder ``demo/``, which
it clears first) and ``node`` owns ``<state_dir>/node/node.lock`` (its replicas, boots
and logs). The lock is an ``flock`` on an open file: the kernel drops it
when its holder exits, however it dies, so a dead holder's lock is simply taken over and
no stale file has to be judged. A second launcher on the same directory is refused
before it touches anything, naming the holder the file records.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from types import TracebackType

from queue_rollout.errors import FarmBusy


class Owner:
    """Hold *path* exclusively while the launcher runs (a context manager). *busy* is
    what a second launcher is told, before the holder: ``farm f is already up``."""

    def __init__(self, path: Path, busy: str) -> None:
        self.path, self.busy = Path(path), busy
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FarmBusy(f"{self.busy}: {self.holder()} "
                           f"(it holds {self.path})") from None
        record = {"pid": os.getpid(), "since": time.time(), "argv": sys.argv}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd

    def holder(self) -> str:
        """``pid N since T`` as the holder wrote it (``pid unknown`` while it writes)."""
        try:
            record = json.loads(self.path.read_text() or "{}")
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record["since"])))
            return f"pid {int(record['pid'])} since {since}"
        except (OSError, ValueError, KeyError, TypeError):
            return "pid unknown"

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would let two holders lock two
        different files of the same name)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Owner:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
