"""Supervised children: restarted with backoff that doubles in a crash loop and starts
over after a child that ran healthy for a while (the clock is passed in)."""

from __future__ import annotations

import sys

from queue_rollout.procs import HEALTHY_S, Supervised
from queue_rollout.virtual.clock import ManualClock


def test_backoff_doubles_in_a_crash_loop_and_starts_over_after_a_healthy_run():
    clock = ManualClock(start=100.0)
    child = Supervised("quick exit", [sys.executable, "-c", "pass"], clock=clock)
    child.keep()  # first start
    delays = []
    for _ in range(3):  # it dies at once, three times
        assert child.proc is not None
        child.proc.wait()
        child.keep()  # notices the exit: no restart before the backoff
        assert child.proc is None
        delays.append(child.next_start - clock.now)
        clock.now = child.next_start
        child.keep()  # restarted
    assert delays == [1.0, 2.0, 4.0] and child.restarts == 3
    child.proc.wait()
    clock.now += HEALTHY_S  # this run lasted long enough to count as healthy
    child.keep()
    assert child.restarts == 1 and child.next_start - clock.now == 1.0
    clock.now = child.next_start
    child.keep()
    child.proc.wait()
