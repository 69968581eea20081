"""The control Redis's cost per group, measured on a private Redis: every group reserved,
settled, delivered in a batch and acknowledged (a batch that does not form raises),
back to back and with the calls spaced."""

from __future__ import annotations

import math

import pytest

from queue_rollout.errors import InvariantViolation
from queue_rollout.lab import control_cost
from queue_rollout.lab.control_cost import measure_control_per_group


@pytest.mark.parametrize("gap_s", [0.0, 0.001])
def test_a_groups_calls_on_the_control_redis_are_measured(tmp_path, gap_s):
    per_group = measure_control_per_group(tmp_path / "redis", groups=32, group_size=4,
                                          batch_size=8, rounds=1, gap_s=gap_s)
    assert math.isfinite(per_group)


def test_settled_groups_that_make_no_batch_are_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(control_cost.Ledger, "pop_batch", lambda self, consumer: None)
    with pytest.raises(InvariantViolation, match="made no batch"):
        measure_control_per_group(tmp_path / "redis", groups=8, group_size=4, batch_size=8,
                                  rounds=1)
