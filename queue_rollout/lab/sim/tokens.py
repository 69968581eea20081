"""Token sequences kept as runs: what lets the engine model hold a farm's contexts.

A simulated context is a few arithmetic runs of token ids (a prompt's, each turn's
output, each tool's output), so :class:`Tokens` keeps it as a tuple of ``range``
objects: its length, indexing, slicing, concatenation and comparison cost per run,
never per token. A thousand replicas' prefix caches then hold run tuples instead of
hundreds of millions of ints. Any other sequence of ints (a real prompt's ids) is
taken as it is and compressed where it runs in steps.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import overload


class Tokens(Sequence[int]):
    """An immutable sequence of token ids stored as runs (non-empty ``range`` s)."""

    __slots__ = ("_ends", "_runs")

    def __init__(self, runs: Iterable[range] = ()) -> None:
        merged: list[range] = []
        for r in runs:
            if not r:
                continue
            if merged:  # a run that continues the last one's progression joins it
                last = merged[-1]
                step = last.step if len(last) > 1 else r[0] - last[0]
                if step and r[0] == last[-1] + step and (len(r) == 1 or r.step == step):
                    merged[-1] = range(last[0], r[-1] + step, step)
                    continue
            merged.append(r)
        self._runs = tuple(merged)
        ends, total = [], 0
        for r in merged:
            total += len(r)
            ends.append(total)
        self._ends = ends

    @classmethod
    def of(cls, tokens: Sequence[int] | Iterable[int]) -> Tokens:
        """*tokens* as Tokens: itself, one run for a range, else runs of step 1."""
        if isinstance(tokens, Tokens):
            return tokens
        if isinstance(tokens, range):
            return cls((tokens,))
        runs: list[range] = []
        start = prev = None
        for t in tokens:
            if prev is not None and t == prev + 1:
                prev = t
                continue
            if start is not None and prev is not None:
                runs.append(range(start, prev + 1))
            start = prev = t
        if start is not None and prev is not None:
            runs.append(range(start, prev + 1))
        return cls(runs)

    @property
    def runs(self) -> tuple[range, ...]:
        return self._runs

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Tokens: ...

    def __getitem__(self, index: int | slice) -> int | Tokens:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return Tokens.of([self[i] for i in range(start, stop, step)])
            return self._slice(start, stop)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("Tokens index out of range")
        k = bisect_right(self._ends, index)
        return self._runs[k][index - (self._ends[k - 1] if k else 0)]

    def _slice(self, start: int, stop: int) -> Tokens:
        if start >= stop:
            return EMPTY
        k = bisect_right(self._ends, start)
        pos = self._ends[k - 1] if k else 0
        runs = []
        while pos < stop:
            r = self._runs[k]
            runs.append(r[max(start - pos, 0):min(stop - pos, len(r))])
            pos += len(r)
            k += 1
        return Tokens(runs)

    def __iter__(self) -> Iterator[int]:
        for r in self._runs:
            yield from r

    def __add__(self, other: Sequence[int]) -> Tokens:
        return Tokens((*self._runs, *Tokens.of(other)._runs))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        if len(self) != len(other):
            return False
        return common_prefix(self, Tokens.of(other)) == len(self)

    __hash__ = None  # type: ignore[assignment]  # equal sequences may differ in runs

    def __repr__(self) -> str:
        return f"Tokens({list(self._runs)!r})"


EMPTY = Tokens()


def common_prefix(a: Tokens, b: Tokens) -> int:
    """How many leading tokens *a* and *b* share: run against run, and inside the
    first pair of runs that differ, a binary search over range slices (each
    comparison constant time)."""
    ra_all, rb_all = a.runs, b.runs
    ia = ib = oa = ob = n = 0
    while ia < len(ra_all) and ib < len(rb_all):
        ra, rb = ra_all[ia], rb_all[ib]
        m = min(len(ra) - oa, len(rb) - ob)
        sa, sb = ra[oa:oa + m], rb[ob:ob + m]
        if sa == sb:
            n, oa, ob = n + m, oa + m, ob + m
            if oa == len(ra):
                ia, oa = ia + 1, 0
            if ob == len(rb):
                ib, ob = ib + 1, 0
            continue
        return n + shared_prefix(sa, sb, m)
    return n


def shared_prefix(a: Sequence[int], b: Sequence[int], differ_by: int) -> int:
    """How many leading items *a* and *b* share, given that their first *differ_by*
    differ somewhere: a binary search over slices (constant time each for ranges and
    short for tuples)."""
    lo, hi = 0, differ_by  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
