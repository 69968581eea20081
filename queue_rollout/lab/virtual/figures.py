"""What a run's batch-ready times and pause ends say, in seconds from its start: the
rollout intervals and their mean, the steady groups/hour, the median time between
batches, and the schedule figures the bench and the planner report. The virtual farm's
report, the bench's runs and the demo's all take their figures from here."""

from __future__ import annotations

import itertools
import math
import statistics


def rollout_intervals(ready: list[float], pause_ends: list[float]) -> list[float]:
    """Batch k (k = 2..): from the end of batch k-1's pause to batch k ready (as far as
    batches were paused after)."""
    return [ready[k] - pause_ends[k - 1]
            for k in range(1, min(len(ready), len(pause_ends) + 1))]


def mean_rollout_interval(ready: list[float], pause_ends: list[float]) -> float:
    """The mean of :func:`rollout_intervals`; NaN where there are none."""
    intervals = rollout_intervals(ready, pause_ends)
    return sum(intervals) / len(intervals) if intervals else math.nan


def steady_groups_per_hour(ready: list[float], batch_size: int) -> float:
    """Groups consumed per hour from the first batch ready to the last (the reference's
    steady window: (N - 1) x B groups over that time)."""
    if len(ready) < 2 or ready[-1] <= ready[0]:
        return math.nan
    return (len(ready) - 1) * batch_size / (ready[-1] - ready[0]) * 3600.0


def median_batch_interval(ready: list[float]) -> float:
    """The median time between successive batches ready."""
    gaps = [b - a for a, b in itertools.pairwise(ready)]
    return statistics.median(gaps) if gaps else math.nan


def num(value: float, digits: int) -> float | None:
    """*value* rounded, None where it is undefined (JSON has no NaN)."""
    return None if math.isnan(value) else round(value, digits)


def schedule_figures(ready: list[float], pause_ends: list[float], batch_size: int,
                     train_batches: int) -> dict[str, float | None]:
    """What the batch-ready times alone say: first and last batch ready, the median
    time between batches, the mean cycle (batch k-1 ready to batch k ready, k = 2 up
    to the last trained batch: the rollout and the pause), the steady groups/hour (batch
    1 ready to the last trained one; with rolling consumption, to the last)."""
    cycles = [ready[k] - ready[k - 1] for k in range(1, min(len(ready), train_batches))]
    steady = ready[:train_batches] if train_batches else ready
    return {"first_batch_s": num(ready[0] if ready else math.nan, 3),
            "batches_ready_s": num(ready[-1] if ready else math.nan, 3),
            "median_batch_interval_s": num(median_batch_interval(ready), 3),
            "mean_cycle_s": num(sum(cycles) / len(cycles) if cycles else math.nan, 3),
            "steady_groups_per_hour": num(steady_groups_per_hour(steady, batch_size), 1)}
