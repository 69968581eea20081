"""Helpers for tests and simulations: a clock moved by hand, trivial prompts."""

from __future__ import annotations


class FakeClock:
    """A clock that only moves when told to; pass it as a Ledger's ``clock``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def trivial_prompts(n: int, prefix: str = "p") -> list[tuple[str, bytes]]:
    """*n* (id, prompt JSON) pairs with ids ``p0``, ``p1``, ..."""
    return [(f"{prefix}{i}", b'{"prompt": "x"}') for i in range(n)]
