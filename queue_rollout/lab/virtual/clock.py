"""The virtual farm's clock: it moves only when told to."""

from __future__ import annotations


class ManualClock:
    """A clock that only moves when told to; pass it as a Ledger's ``clock``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
