"""The figures of batch-ready times and pause ends, by their definitions."""

from __future__ import annotations

import math

import pytest

from queue_rollout.lab.virtual.figures import (
    mean_rollout_interval,
    median_batch_interval,
    num,
    rollout_intervals,
    schedule_figures,
    steady_groups_per_hour,
)

READY = [1.0, 4.0, 8.0, 9.0]
PAUSE_ENDS = [2.0, 5.0, 8.5]  # batches 1 to 3 trained on, batch 4 drained


def test_a_rollout_interval_runs_from_a_pause_end_to_the_next_batch_ready():
    assert rollout_intervals(READY, PAUSE_ENDS) == [2.0, 3.0, 0.5]
    assert mean_rollout_interval(READY, PAUSE_ENDS) == pytest.approx(5.5 / 3)
    assert rollout_intervals(READY, PAUSE_ENDS[:1]) == [2.0]  # only after a pause
    assert rollout_intervals(READY, []) == []
    assert math.isnan(mean_rollout_interval(READY, []))


def test_the_steady_rate_and_the_median_gap_between_batches():
    assert steady_groups_per_hour([10.0, 20.0, 40.0], 4) == pytest.approx(2 * 4 / 30 * 3600)
    assert math.isnan(steady_groups_per_hour([10.0], 4))
    assert math.isnan(steady_groups_per_hour([10.0, 10.0], 4))
    assert median_batch_interval([10.0, 20.0, 40.0]) == pytest.approx(15.0)
    assert math.isnan(median_batch_interval([10.0]))


def test_num_rounds_and_has_no_nan():
    assert num(1.23456, 2) == 1.23
    assert num(math.nan, 2) is None


def test_the_schedule_figures_stop_the_steady_window_at_the_last_trained_batch():
    assert schedule_figures(READY, PAUSE_ENDS, batch_size=2, train_batches=3) == {
        "first_batch_s": 1.0, "batches_ready_s": 9.0,
        "median_batch_interval_s": 3.0,  # gaps 3, 4, 1
        "mean_cycle_s": 3.5,  # batches 2 and 3: 3 and 4
        "steady_groups_per_hour": round(2 * 2 / 7 * 3600, 1)}  # batches 1 to 3
    rolling = schedule_figures(READY, [], batch_size=2, train_batches=0)
    assert rolling["steady_groups_per_hour"] == round(3 * 2 / 8 * 3600, 1)  # to the last
    assert rolling["mean_cycle_s"] is None
    assert schedule_figures([], [], batch_size=2, train_batches=3)["first_batch_s"] is None
