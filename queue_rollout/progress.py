"""The live view of long commands (demo, bench, the soak): a tqdm bar on a terminal,
and where their logs go.

A long command shows its progress and its result on the terminal; its own log and its
child processes' logs go to files (:func:`log_to_file`), unless it runs with ``-v``.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm


class LiveView:
    """One progress bar: *total* units of work, a line of fields beside it. On a
    terminal it redraws in place; elsewhere (a pipe, a log file) it prints a plain line
    when the work has moved, at most every *plain_every_s* seconds (and at the end);
    ``enabled=False`` keeps it silent."""

    def __init__(self, desc: str, total: int, unit: str, *, out: TextIO | None = None,
                 enabled: bool | None = None, plain_every_s: float = 5.0) -> None:
        stream = out if out is not None else sys.stderr
        terminal = stream.isatty()
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=stream, leave=True,
                         dynamic_ncols=True,
                         disable=not terminal if enabled is None else not enabled)
        self._plain = stream if enabled is None and not terminal else None
        self._desc, self._unit, self._plain_every_s = desc, unit, plain_every_s
        self._total, self._drawn_at, self._printed = total, -math.inf, -1

    def show(self, done: int, **fields: Any) -> None:
        """*done* units of *total*, and the fields as ``name=value``; redrawn at most
        five times a second (and at the end), however often it is called."""
        now = time.monotonic()
        if self._plain is not None:
            self._line(self._plain, now, done, fields)
            return
        if self._bar.disable or (now - self._drawn_at < 0.2 and done < self._total):
            return
        self._drawn_at = now
        self._bar.n = done
        self._bar.set_postfix(fields, refresh=False)
        self._bar.refresh()

    def _line(self, out: TextIO, now: float, done: int, fields: dict[str, Any]) -> None:
        if done == self._printed or (now - self._drawn_at < self._plain_every_s
                                     and done < self._total):
            return
        self._drawn_at, self._printed = now, done
        out.write(f"{self._desc.strip()}: {done}/{self._total} {self._unit}"
                  + "".join(f"  {k}={v}" for k, v in fields.items()) + "\n")
        out.flush()

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def log_to_file(path: Path, *, console_level: int = logging.WARNING) -> None:
    """This process's log goes to *path* (INFO and up); the terminal gets only
    *console_level* and up, so a live view is not torn by log lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler):
            handler.setLevel(console_level)
    file = logging.FileHandler(path, encoding="utf-8")
    file.setLevel(logging.INFO)
    file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file)
    root.setLevel(min(root.level, logging.INFO) if root.level else logging.INFO)
