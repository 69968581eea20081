"""Completion order: which groups reached the trainer first, beside the order they were
submitted in. Refill delivers a group when it is whole, so where many groups are in
flight those that finish fast may be trained on sooner; these figures say whether they
were."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's tau-a of two rankings (ties count as neither); nan under two values."""
    n = len(xs)
    if n < 2:
        return math.nan
    pairs = [(xs[i] - xs[j]) * (ys[i] - ys[j]) for i in range(n) for j in range(i + 1, n)]
    return (sum(d > 0 for d in pairs) - sum(d < 0 for d in pairs)) / len(pairs)


def mean_interval(values: Sequence[float]) -> dict[str, float]:
    """The mean of *values* with its normal 95% interval (``low``, ``high``)."""
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return {"mean": round(mean, 3), "low": round(mean - half, 3), "high": round(mean + half, 3)}


def completion_order(lengths: Mapping[str, Sequence[int]], submitted: Sequence[str],
                     delivered: Sequence[str], trained: int) -> dict[str, Any]:
    """*lengths*: each group's members' output lengths as submitted (which the episodes
    produce exactly); *submitted* and *delivered*: group ids in submission and delivery
    order; *trained*: the groups the trainer trained on, the first delivered. Their mean
    output length per member against the groups not trained on (delivered later or
    never) and against all submitted, how many of them came from the first that many
    submitted, and the rank correlations of delivery order with submission order and
    with a group's length (positive: longer groups later)."""
    index = {g: i for i, g in enumerate(submitted)}
    mean_length = {g: statistics.fmean(lengths[g]) for g in submitted}
    first = list(delivered[:trained])
    taken = set(first)
    rest = [mean_length[g] for g in submitted if g not in taken]
    rank = list(range(len(delivered)))
    return {
        "groups_submitted": len(submitted), "groups_trained": len(first),
        "trained_from_first_submitted": sum(index[g] < len(first) for g in first),
        "length_trained": mean_interval([mean_length[g] for g in first]),
        "length_not_trained": mean_interval(rest) if rest else None,
        "length_submitted": mean_interval(list(mean_length.values())),
        "order_tau": round(kendall_tau([index[g] for g in delivered], rank), 4),
        "length_order_tau": round(kendall_tau([mean_length[g] for g in delivered], rank), 4),
    }
