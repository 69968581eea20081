"""Redis's own counters: a reading from a real Redis, and the window between two."""

from __future__ import annotations

import pytest
import redis

from queue_rollout.lab.redis_info import Sample, Window, read


def test_a_window_is_the_difference_of_two_readings_without_the_unchanged():
    a = Sample(1.0, {"get": 5, "set": 2}, 0.5, 3, {"get": 50, "set": 20})
    b = Sample(3.0, {"get": 9, "set": 2, "evalsha": 4}, 0.9, 4,
               {"get": 90, "set": 20, "evalsha": 400})
    w = Window.between(a, b)
    assert w == Window(2.0, {"get": 4, "evalsha": 4}, pytest.approx(0.4),
                       {"get": 40, "evalsha": 400})
    assert w.calls_per_s == 4.0 and w.core_pct == pytest.approx(20.0)
    ref = Window(4.0, {"get": 4}, 0.0)
    assert w.per_s_above(ref) == {"evalsha": 2.0, "get": 1.0}
    assert b.total == 15


def test_a_reading_counts_the_commands_run_and_leaves_info_out(r: redis.Redis):
    before = read(r)
    for _ in range(3):
        r.ping()
    window = Window.between(before, read(r))
    assert window.calls.get("ping") == 3
    assert "info" not in window.calls and before.clients >= 1
