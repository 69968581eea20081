"""What one mode's run through the real stack measured: its batches, pauses, requests and
counters (:class:`ModeRun`), and the running attempts sampled while it ran."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from queue_rollout.lab.redis_info import Window
from queue_rollout.lab.virtual.farm import SimReport
from queue_rollout.lab.virtual.figures import (
    mean_rollout_interval,
    median_batch_interval,
    rollout_intervals,
    steady_groups_per_hour,
)
from queue_rollout.lab.workloads.profile import manifest_digest
from queue_rollout.ledger.core import Ledger


@dataclass
class ModeRun:
    """What one mode's run measured; times in seconds since the prompts were submitted."""

    mode: str
    slots: int
    placement: str = "any"  # rollout.placement
    adaptive: bool = False  # engine.adaptive_slots
    ready: list[float] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)  # trainer's windows
    accepted_at_ready: list[int] = field(default_factory=list)
    delivered: dict[str, list[int]] = field(default_factory=dict)  # group -> member tokens
    delivered_turns: dict[str, list[list[int]]] = field(default_factory=dict)  # per call
    delivered_prompts: list[dict[str, Any]] = field(default_factory=list)  # as the trainer got them
    requests: list[dict[str, Any]] = field(default_factory=list)  # the replicas' log entries
    counters: dict[str, int] = field(default_factory=dict)
    doctor_problems: list[str] = field(default_factory=list)
    in_flight: list[tuple[float, int]] = field(default_factory=list)  # ledger's running
    batch_size: int = 0
    ideal: SimReport | None = None
    #: the bench Redis's own counters from submission to the last batch (every process
    #: of the farm, the trainer's calls too)
    redis: Window | None = None
    started_at: float = 0.0  # when the prompts were submitted (monotonic clock)
    #: real replicas: their own counters' differences over the run, and their running
    #: requests sampled (seconds since submission, count); no request log
    engine_counters: dict[str, float] = field(default_factory=dict)
    served: list[tuple[float, int]] = field(default_factory=list)
    farm: str = ""  # the farm's name (its ledger's keys)
    #: group -> when its batch reached the trainer (wall clock, the ledger's)
    delivered_at: dict[str, float] = field(default_factory=dict)
    #: (group, member) -> when it was sent (wall clock), where the rollout says
    sent: dict[tuple[str, int], float] = field(default_factory=dict)
    #: group -> when it was whole and accepted (wall clock), where the rollout says
    accepted_at: dict[str, float] = field(default_factory=dict)
    #: CPU seconds the rollout's own processes spent from submission to the last batch
    #: (the farm: workers, their episode processes and the collector, not Redis)
    cpu_s: float | None = None

    @property
    def delivered_digest(self) -> str:
        return manifest_digest(self.delivered_prompts)

    @property
    def mean_pause_s(self) -> float:
        """How long generation stood still for the trainer, on average (nan: never)."""
        return (sum(b - a for a, b in self.pauses) / len(self.pauses) if self.pauses
                else float("nan"))

    @property
    def pause_ends(self) -> list[float]:
        return [end for _, end in self.pauses]

    @property
    def rollout_intervals(self) -> list[float]:
        """Batch k (k = 2 .. train_batches): from the end of batch k-1's pause to k ready."""
        return rollout_intervals(self.ready, self.pause_ends)

    @property
    def mean_rollout_interval(self) -> float:
        return mean_rollout_interval(self.ready, self.pause_ends)

    @property
    def all_work_s(self) -> float:
        return self.ready[-1] if self.ready else float("nan")

    def active_timeline(self) -> list[tuple[float, int]]:
        """(time, running requests from then on), a step function."""
        events = sorted([(r["started"], 1) for r in self.requests] +
                        [(r["ended"], -1) for r in self.requests])
        running, out = 0, [(0.0, 0)]
        for t, d in events:
            running += d
            out.append((t, running))
        return out

    @property
    def mean_active(self) -> float:
        """Running requests averaged over generation time (pause windows excluded):
        from the replicas' request logs, else from their own samples."""
        if not self.requests and self.served:
            return self._time_mean([*self.served, (self.all_work_s, 0)])
        return self._time_mean([*self.active_timeline(), (self.all_work_s, 0)])

    @property
    def accepted_groups_per_hour(self) -> float:
        """Accepted groups per hour from batch 1 ready to the last trained batch ready
        (with rolling consumption, no batch trained: to the last batch ready)."""
        if not self.pauses:
            return self.steady_groups_per_hour
        k = min(len(self.ready), max(len(self.pauses), 1)) - 1
        if k < 1 or self.ready[k] <= self.ready[0]:
            return float("nan")
        return (self.accepted_at_ready[k] - self.accepted_at_ready[0]) / (
            self.ready[k] - self.ready[0]) * 3600

    @property
    def output_tokens(self) -> int:
        return sum(sum(tokens) for tokens in self.delivered.values())

    @property
    def steady_groups_per_hour(self) -> float:
        return steady_groups_per_hour(self.ready, self.batch_size)

    @property
    def median_batch_interval(self) -> float:
        return median_batch_interval(self.ready)

    @property
    def mean_in_flight(self) -> float:
        """Attempts running in the ledger (tool waits included), averaged over
        generation time from the samples taken (pause windows excluded)."""
        return self._time_mean(self.in_flight)

    def _time_mean(self, steps: list[tuple[float, int]]) -> float:
        """The mean of a step function ((time, value from then on), in order) from 0
        to all-work, over generation time only (pause windows excluded)."""
        end, area, generating = self.all_work_s, 0.0, 0.0
        for (t0, n), (t1, _) in itertools.pairwise(steps):
            t0, t1 = max(0.0, min(t0, end)), max(0.0, min(t1, end))
            for a, b in _minus(t0, t1, self.pauses):
                area += n * (b - a)
                generating += b - a
        return area / generating if generating else 0.0



def _minus(a: float, b: float, windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [a, b) outside every window."""
    parts = [(a, b)] if b > a else []
    for w0, w1 in windows:
        parts = [piece for x, y in parts
                 for piece in ((x, min(y, w0)), (max(x, w1), y)) if piece[1] > piece[0]]
    return parts



class RunningSampler:
    """Samples how many attempts the ledger holds running (its lease set), every
    *period* seconds on a thread, as (seconds since *t0*, count)."""

    def __init__(self, ledger: Ledger, t0: float, period: float) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ledger, t0, period),
                                        name="running-sampler", daemon=True)
        self._thread.start()

    def _run(self, ledger: Ledger, t0: float, period: float) -> None:
        while not self._stop.wait(period):
            self.samples.append((time.monotonic() - t0, ledger.leases_held()))

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples

