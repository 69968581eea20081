"""The thinking-model lengths: the seed's mean, a mass at the cap, members differing."""

from __future__ import annotations

import statistics

from queue_rollout.lab.workloads.seed import BOBA_PARAMS
from queue_rollout.lab.workloads.thinking import cap_share, thinking_lengths


def test_thinking_lengths_have_the_seed_mean_a_mass_at_the_cap_and_differ():
    lengths = thinking_lengths(128, 8, BOBA_PARAMS)
    assert lengths == thinking_lengths(128, 8, BOBA_PARAMS)
    members = [n for ms in lengths.values() for n in ms]
    assert 10_000 < statistics.mean(members) < 11_500  # the seed: 10,729
    assert max(members) == BOBA_PARAMS.cap and 0.05 < cap_share(lengths, BOBA_PARAMS.cap) < 0.4
    assert min(members) >= BOBA_PARAMS.min_tokens
    assert sum(len(set(ms)) > 1 for ms in lengths.values()) > 0.9 * 128  # members differ
