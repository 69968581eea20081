"""The calibration fit: a damped Newton iteration in log space."""

from __future__ import annotations

import math

import pytest

from queue_rollout.lab.bench.fit import fit


def test_fit_finds_the_parameters_of_a_known_power_law():
    # figures y1 = a^2 b, y2 = a / b^0.5: a = 3, b = 2 gives y1 = 18, y2 = 2.1213
    def evaluate(p):
        return {"y1": p["a"] ** 2 * p["b"], "y2": p["a"] / math.sqrt(p["b"])}

    result = fit(evaluate, {"a": 1.0, "b": 1.0}, {"y1": 18.0, "y2": 3 / math.sqrt(2)},
                 max_move=2.0, tolerance=1e-4, rounds=10)
    assert result.params["a"] == pytest.approx(3.0, rel=1e-3)
    assert result.params["b"] == pytest.approx(2.0, rel=1e-3)
    assert result.worst_error < 1e-3
    assert result.evaluations == len(result.history)


def test_fit_returns_the_best_point_when_it_cannot_meet_the_targets():
    # y cannot go below 1: the best is the smallest a tried, and the error stays
    def evaluate(p):
        return {"y": 1.0 + p["a"]}

    result = fit(evaluate, {"a": 1.0}, {"y": 0.5}, rounds=3)
    assert result.worst_error > 0.5
    assert result.figures == min((f for _, f in result.history), key=lambda f: f["y"])
