"""A process's clock against the Redis server's.

Every script takes its clock through ARGV from the process that calls it, so a lease
written by a worker and judged by the collector compares two machines' clocks. Each
process therefore compares its clock (the one it is built with) with Redis's ``TIME``
when it registers and at every heartbeat: within ``timeouts.clock_skew`` leases and doubt
stay safe; beyond it the process refuses work, naming both clocks.

The offset is measured as this clock's reading halfway through the ``TIME`` call minus
Redis's answer, and judged against the round trip: a clock is skewed only when no
moment of the call lies within the tolerance of Redis's answer. A reply held back (a
Redis whose AOF write waits on a busy disk sends its replies seconds late) is not a
skewed clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis

from queue_rollout.errors import ClockSkewed
from queue_rollout.ledger.connection import client_url, translate_errors


def _time_call(client: redis.Redis, clock: Callable[[], float]) -> tuple[float, float, float]:
    """(this clock before, Redis's answer, this clock after) one ``TIME`` call."""
    with translate_errors(client_url(client)):
        before = clock()
        seconds, micros = client.time()
        after = clock()
    return before, seconds + micros / 1e6, after


def clock_offset(client: redis.Redis, clock: Callable[[], float]) -> tuple[float, float]:
    """(this clock minus Redis's, in seconds; Redis's time) from one ``TIME`` call."""
    before, theirs, after = _time_call(client, clock)
    return (before + after) / 2 - theirs, theirs


def check_clock(client: redis.Redis, clock: Callable[[], float], tolerance: float,
                who: str) -> float:
    """This clock's offset from Redis's; :class:`ClockSkewed` naming both clocks when it
    is beyond *tolerance* seconds from every moment of the call."""
    before, theirs, after = _time_call(client, clock)
    offset, half_trip = (before + after) / 2 - theirs, (after - before) / 2
    if abs(offset) - half_trip > tolerance:
        raise ClockSkewed(
            f"{who}: this process's clock reads {_stamp(theirs + offset)} and the Redis "
            f"server's {_stamp(theirs)}: {offset:+.3f} s apart (the call took "
            f"{after - before:.3f} s), beyond timeouts.clock_skew = {tolerance:g} s; it "
            "takes no work until its clock is set right (NTP)")
    return offset


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def wall_clock(offset: float = 0.0) -> Callable[[], float]:
    """``time.time``, *offset* seconds off (0 in production; a test builds a process with
    a skewed clock this way)."""
    if not offset:
        return time.time
    return lambda: time.time() + offset
