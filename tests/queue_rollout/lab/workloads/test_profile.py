"""A profile's manifest at a scale, its digest, and a profile without episodes."""

from __future__ import annotations

import pytest

from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.profile import Profile, manifest_digest


def test_scale_shrinks_lengths_and_keeps_episode_time_proportional():
    scale = Scale(time=0.1, tokens=0.125)
    assert scale.length(16384) == 2048 and scale.length(1) == 1
    # an episode's duration = tokens x step: both scaled, the product by `time`
    assert scale.length(1024) * scale.step_factor == pytest.approx(1024 * 0.1)
    ab, ba = [{"id": "a"}, {"id": "b"}], [{"id": "b"}, {"id": "a"}]
    assert manifest_digest(ab) == manifest_digest(ba)


def test_a_profile_without_episodes_is_refused():
    with pytest.raises(ValueError, match="profile none: neither lengths nor turns"):
        Profile("none", "no episodes").manifest(Shape(), Scale())
