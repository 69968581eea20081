"""Every pilot by name."""

from __future__ import annotations

import pytest

from queue_rollout.lab.workloads.pilots import KV_PRESSURE, PILOTS
from queue_rollout.lab.workloads.registry import PILOT_NAMES, pilot_profile


def test_every_pilot_name_gives_the_profile_of_that_name():
    assert PILOT_NAMES == ("long-tail", "equal", "group-between", "mixed-tail",
                           "swe-agentic", "boba-math", "boba-math-b8", "long-prompt",
                           "kv-pressure")
    for name in PILOT_NAMES:
        assert pilot_profile(name).name == name
    assert pilot_profile("equal") is PILOTS["equal"]
    assert pilot_profile("kv-pressure") is KV_PRESSURE


def test_an_unknown_name_is_a_key_error():
    with pytest.raises(KeyError):
        pilot_profile("no-such-pilot")
