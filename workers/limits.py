"""Adaptive concurrency on one GPU: the supervisor's side, which reads the replica's
``/metrics`` and sets the worker's limit, and the episode processes' side, which take
a new job only under it.

The supervisor hands the limit to its episode processes through a small file of its
own (one integer, replaced atomically), not through Redis: a thousand GPUs' processes
looking at a limit every fraction of a second would cost Redis more than everything
else they do. Each process reads the file at most every ``GATE_READ_S`` and takes its
share of the limit: slots are counted from the first process's, so a limit of 5 over
processes of 4 slots lets the first take 4 and the second 1.

What a replica that cannot tell its KV room does:

- **No** ``/metrics`` (HTTP 404: SGLang started without ``--enable-metrics``): logged
  once; the limit stays ``slots_per_replica``. It is looked at again every
  ``NO_METRICS_RETRY_S`` (a replica restarted with metrics is followed again).
- **No KV metrics** in an answer (no ``sglang:token_usage`` or
  ``sglang:num_queue_reqs``): as for a 404.
- **Unreachable** ``/metrics`` (down, timed out, an HTTP error other than 404): the
  last limit is kept and the failure logged, once per outage.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from queue_rollout.config import EngineConfig
from queue_rollout.engines.base import EngineClient, EngineError
from queue_rollout.engines.concurrency import SlotLimit, parse_metrics

log = logging.getLogger(__name__)
#: An episode process looks at its limit file at most this often.
GATE_READ_S = 0.25
#: A replica that answered 404 for /metrics is asked again this often.
NO_METRICS_RETRY_S = 60.0


class AdaptiveLimit:
    """The supervisor's controller: one look at the replica per :meth:`look`."""

    def __init__(self, engine: EngineConfig, client: EngineClient, worker_id: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.control = SlotLimit(engine.slots_per_replica, engine.min_slots_per_replica)
        self.client, self.worker_id = client, worker_id
        self.clock = clock
        self._no_metrics_until = 0.0
        self._no_metrics_logged = False
        self._unreachable = False

    @property
    def limit(self) -> int:
        return self.control.limit

    def look(self) -> int:
        """Read the replica's metrics once and return the limit (unchanged when they
        could not be read)."""
        if self.clock() < self._no_metrics_until:
            return self.limit
        try:
            signal = parse_metrics(self.client.metrics(), self.client.metric_names)
        except EngineError as exc:
            if exc.status == 404:
                self._without_metrics()
            elif not self._unreachable:
                self._unreachable = True
                log.warning("worker %s: cannot read the replica's metrics (%s): keeping "
                            "the limit at %d slots", self.worker_id, exc, self.limit)
            return self.limit
        if signal is None:
            self._without_metrics()
            return self.limit
        if self._unreachable:
            self._unreachable = False
            log.info("worker %s: the replica's metrics are readable again", self.worker_id)
        before = self.limit
        after = self.control.observe(signal)
        if after != before:
            log.info("worker %s: limit %d -> %d slots (token usage %.2f, %s running, "
                     "%d queued, %d retractions so far)", self.worker_id, before, after,
                     signal.token_usage, "?" if signal.running is None else signal.running,
                     signal.queued, signal.retractions)
        return after

    def _without_metrics(self) -> None:
        """The replica exports no usable metrics: the ceiling, looked at again later."""
        if not self._no_metrics_logged:
            self._no_metrics_logged = True
            log.warning("worker %s: the replica %s exports no KV metrics (SGLang needs "
                        "--enable-metrics): adaptive concurrency keeps %d slots",
                        self.worker_id, self.client.url, self.control.ceiling)
        self.control.limit = self.control.ceiling
        self._no_metrics_until = self.clock() + NO_METRICS_RETRY_S


class LimitFile:
    """The supervisor's end of the limit handed to its episode processes."""

    def __init__(self, limit: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="queue-rollout-limit-"))
        self.path = self.dir / "limit"
        self.write(limit)

    def write(self, limit: int) -> None:
        tmp = self.dir / "limit.tmp"
        tmp.write_text(f"{limit}\n")
        os.replace(tmp, self.path)

    def remove(self) -> None:
        for p in (self.path, self.dir / "limit.tmp"):
            p.unlink(missing_ok=True)
        self.dir.rmdir()


class SlotGate:
    """An episode process's end: how many of its slots may hold a job now."""

    def __init__(self, path: str, first_slot: int, threads: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.first_slot, self.threads = path, first_slot, threads
        self.clock = clock
        self._share, self._read_at = threads, -float("inf")

    def share(self) -> int:
        """Its slots under the worker's limit (all of them without a limit file; the
        last share read when the file cannot be read)."""
        if not self.path or self.clock() - self._read_at < GATE_READ_S:
            return self._share
        self._read_at = self.clock()
        try:
            limit = int(Path(self.path).read_text().strip())
        except (OSError, ValueError):
            return self._share
        self._share = max(0, min(self.threads, limit - self.first_slot))
        return self._share
