"""A process's clock against the Redis server's ``TIME``: within the tolerance the
offset is measured, beyond it the process is refused, naming both clocks."""

from __future__ import annotations

import time

import msgspec
import pytest

from queue_rollout.config import Config, decode_config
from queue_rollout.errors import ClockSkewed, ConfigError
from queue_rollout.ledger.clock import check_clock, clock_offset, wall_clock


def test_the_offset_is_measured_against_redis_and_refused_beyond_the_tolerance(r):
    tolerance = 1.0
    skewed = wall_clock(0.9 * tolerance)
    offset = check_clock(r, skewed, tolerance, "worker w")
    assert 0.8 < offset < 1.0  # 0.9 s, less what the machine's own clocks disagree by
    behind = check_clock(r, wall_clock(-0.9 * tolerance), tolerance, "worker w")
    assert -1.0 < behind < -0.8
    with pytest.raises(ClockSkewed) as refused:
        check_clock(r, wall_clock(10 * tolerance), tolerance, "worker w")
    message = str(refused.value)
    _, theirs = clock_offset(r, time.time)
    day = time.strftime("%Y-%m-%d", time.gmtime(theirs))
    assert message.startswith(f"worker w: this process's clock reads {day} ")
    assert "and the Redis server's " in message and "+10.0" in message
    assert "beyond timeouts.clock_skew = 1 s" in message
    assert refused.value.exit_code == 2


def test_a_reply_held_back_is_not_a_skewed_clock_and_a_skewed_clock_behind_one_still_is(r):
    """A TIME answered at once whose reply arrived 9 s later (a Redis whose AOF write
    waited on a busy disk): halfway through the call this clock reads 4.5 s past
    Redis's answer, yet the answer lies within the call. Shifted 20 s, it does not."""
    tolerance = 1.0

    def held(shift: float):
        readings = iter([time.time() + shift, time.time() + shift + 9.0])
        return lambda: next(readings)

    assert 4.0 < check_clock(r, held(0.0), tolerance, "collector c") < 5.0
    with pytest.raises(ClockSkewed, match=r"\+2[45]\.\d+ s apart \(the call took 9\.0"):
        check_clock(r, held(20.0), tolerance, "collector c")


def test_the_tolerance_defaults_to_a_third_of_the_lease_and_may_not_exceed_it():
    config = msgspec.convert({"timeouts": {"lease": 3}}, Config)
    assert config.timeouts.skew_tolerance == 1.0
    set_ = msgspec.convert({"timeouts": {"lease": 30, "clock_skew": 2.5}}, Config)
    assert set_.timeouts.skew_tolerance == 2.5
    with pytest.raises(ConfigError, match=r"timeouts.clock_skew: 11 s is more than "
                                          r"lease / 3 = 10 s"):
        decode_config("[timeouts]\nlease = 30\nclock_skew = 11\n", "farm.toml")
