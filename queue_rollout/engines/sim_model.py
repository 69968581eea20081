"""The simulated replica's engine: continuous batching, advanced analytically.

A decode step takes ``step_ms + step_ms_per_request * running`` milliseconds and gives
one token to every running request. Between events (an arrival, a completion, an
abort, a pause) the number of running requests is constant, so progress is computed
in one step instead of per token: 128 simulated slots cost almost no CPU. At most
``slots`` requests run (SGLang's ``--max-running-requests``); the rest wait in order.

Everything here is synchronous and takes the time as an argument, so tests drive it
with a hand-moved clock; :mod:`queue_rollout.engines.sim_server` puts it behind
SGLang's HTTP API in real time.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

PauseMode = Literal["abort", "in_place", "retract"]
VOCAB = 32_000


def _h(*parts: object) -> int:
    """A stable 64-bit hash (no per-process salt, unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def token_id(seed: int, index: int) -> int:
    return 100 + _h("tok", seed, index) % VOCAB


def token_logprob(seed: int, index: int) -> float:
    return -((_h("lp", seed, index) % 5000) / 1000.0)


class DuplicateRid(Exception):
    """An rid that is still waiting or running was sent again (SGLang >= 0.5.10)."""


@dataclass
class SimRequest:
    rid: str
    seed: int
    target: int  # tokens this request will produce if nothing stops it
    weight_version: str
    start_index: int = 0  # tokens already produced by earlier requests (resume)
    produced: float = 0.0
    first_version: str = ""
    arrived: float = 0.0
    started: float | None = None
    on_done: Callable[[SimRequest, dict[str, Any]], None] | None = field(default=None, repr=False)

    @property
    def tokens(self) -> int:
        return min(self.target, int(self.produced + 1e-6))


class SimModel:
    def __init__(self, *, slots: int, step_ms: float, step_ms_per_request: float,
                 now: float = 0.0, weight_version: str = "default") -> None:
        self.slots = slots
        self.step_ms = step_ms
        self.step_ms_per_request = step_ms_per_request
        self.now = now
        self.weight_version = weight_version
        self.running: dict[str, SimRequest] = {}
        self.waiting: deque[SimRequest] = deque()
        self.paused: PauseMode | None = None
        self.log: list[dict[str, Any]] = []  # one entry per request that ended

    # -- time -----------------------------------------------------------------------------

    def step_s(self) -> float:
        return (self.step_ms + self.step_ms_per_request * len(self.running)) / 1000.0

    def next_event(self) -> float:
        """When the next request completes (inf when nothing runs or paused)."""
        if self.paused or not self.running:
            return math.inf
        left = min(r.target - r.produced for r in self.running.values())
        return self.now + max(0.0, left) * self.step_s()

    def advance(self, now: float) -> None:
        """Generate up to *now*, completing requests at their exact times."""
        while True:
            t = self.next_event()
            if t > now:
                break
            self._progress(t)
            for r in [r for r in self.running.values() if r.target - r.produced <= 1e-6]:
                self._end(r, {"type": "length", "length": r.target})
            self._fill()
        self._progress(now)

    def _progress(self, t: float) -> None:
        if t <= self.now:
            return
        if not self.paused and self.running:
            tokens = (t - self.now) / self.step_s()
            for r in self.running.values():
                r.produced = min(float(r.target), r.produced + tokens)
        self.now = t

    def _fill(self) -> None:
        while self.waiting and len(self.running) < self.slots and not self.paused:
            r = self.waiting.popleft()
            r.started = self.now
            self.running[r.rid] = r

    # -- requests -------------------------------------------------------------------------

    def active(self, rid: str) -> bool:
        return rid in self.running or any(r.rid == rid for r in self.waiting)

    def submit(self, request: SimRequest) -> None:
        if self.active(request.rid):
            raise DuplicateRid(request.rid)
        request.arrived = self.now
        request.first_version = self.weight_version
        if request.target <= 0:
            request.started = self.now
            self._end(request, {"type": "length", "length": 0})
            return
        self.waiting.append(request)
        self._fill()

    def abort(self, rid: str = "", abort_all: bool = False) -> int:
        """Abort by rid prefix (as SGLang's scheduler matches), or everything."""
        hit = [r for r in [*self.running.values(), *self.waiting]
               if abort_all or (rid and r.rid.startswith(rid))]
        for r in hit:
            queued = r.rid not in self.running
            message = "Abort in waiting queue" if queued else "Aborted"
            self._end(r, {"type": "abort", "message": message, "status_code": None,
                          "err_type": None})
        self._fill()
        return len(hit)

    def pause(self, mode: PauseMode) -> None:
        if mode == "abort":
            self.abort(abort_all=True)
        self.paused = mode

    def resume(self) -> None:
        self.paused = None
        self._fill()

    def _end(self, r: SimRequest, finish_reason: dict[str, Any]) -> None:
        self.running.pop(r.rid, None)
        if r in self.waiting:
            self.waiting.remove(r)
        self.log.append({"rid": r.rid, "seed": r.seed, "arrived": r.arrived,
                         "started": r.started, "ended": self.now, "tokens": r.tokens,
                         "finish": finish_reason["type"]})
        if r.on_done is not None:
            r.on_done(r, finish_reason)
