"""Completion order's figures on made-up deliveries."""

from __future__ import annotations

import math

import pytest

from queue_rollout.lab.order import completion_order, kendall_tau, mean_interval


def test_kendall_tau_counts_agreeing_and_disagreeing_pairs():
    assert kendall_tau([1, 2, 3], [1, 2, 3]) == 1.0
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert kendall_tau([1, 1], [1, 2]) == 0.0  # a tie counts as neither
    assert math.isnan(kendall_tau([1], [1]))


def test_mean_interval_is_the_normal_95_percent_interval():
    out = mean_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, se 1/sqrt(3)
    half = 1.96 / math.sqrt(3)
    assert out == {"mean": 2.0, "low": round(2 - half, 3), "high": round(2 + half, 3)}
    assert mean_interval([5.0]) == {"mean": 5.0, "low": 5.0, "high": 5.0}


def test_short_groups_delivered_first_show_in_every_figure():
    lengths = {"a": [64, 64], "b": [8, 8], "c": [64, 64], "d": [8, 8]}
    out = completion_order(lengths, ["a", "b", "c", "d"], ["b", "d", "a", "c"], trained=2)
    assert (out["groups_submitted"], out["groups_trained"]) == (4, 2)
    assert out["trained_from_first_submitted"] == 1  # b of a, b
    assert out["length_trained"] == {"mean": 8.0, "low": 8.0, "high": 8.0}
    assert out["length_not_trained"] == {"mean": 64.0, "low": 64.0, "high": 64.0}
    assert out["length_submitted"]["mean"] == 36.0
    assert out["order_tau"] == pytest.approx(round(kendall_tau([1, 3, 0, 2], [0, 1, 2, 3]), 4))
    assert out["length_order_tau"] > 0  # longer groups later
    in_order = completion_order(lengths, ["a", "b", "c", "d"], ["a", "b", "c", "d"], 2)
    assert in_order["order_tau"] == 1.0 and in_order["trained_from_first_submitted"] == 2
    assert completion_order(lengths, ["a", "b"], ["a", "b"], 2)["length_not_trained"] is None
