"""The agentic turn distribution: deterministic, groups and members differing, a share
of harness failures, every turn within its bounds and valid as `member_turns`."""

from __future__ import annotations

import statistics

from queue_rollout.lab.workloads.agentic import AgenticParams, agentic_manifest
from queue_rollout.workers.workflows import check_member_turns

P = AgenticParams()


def test_the_manifest_is_the_same_every_time_and_valid():
    a, b = agentic_manifest(192, 8, P), agentic_manifest(192, 8, P)
    assert a == b and len(a) == 192
    for members in a.values():
        assert check_member_turns(members, group_size=8, max_turns=P.max_turns) is None


def test_groups_and_members_differ_and_a_share_are_harness_failures():
    manifest = agentic_manifest(192, 8, P)
    members = [m for ms in manifest.values() for m in ms]
    turns = [len(m["turns"] if isinstance(m, dict) else m) for m in members]
    assert 0.7 * P.turns_median < statistics.median(turns) < 1.3 * P.turns_median
    assert all(1 <= n <= P.max_turns for n in turns)
    per_group = [[len(m["turns"] if isinstance(m, dict) else m) for m in ms]
                 for ms in manifest.values()]
    assert sum(len(set(g)) > 1 for g in per_group) > 0.9 * len(per_group)  # members differ
    assert len({statistics.median(g) for g in per_group}) > 50  # groups differ
    harness = sum(isinstance(m, dict) for m in members)
    assert 0.5 * P.harness_share * len(members) < harness < 2 * P.harness_share * len(members)
    for m in members:
        ts = m["turns"] if isinstance(m, dict) else m
        assert "tool_s" not in ts[-1]  # the last turn runs no tool
        assert all(P.gen_min <= t["gen"] <= P.gen_max for t in ts)
        assert all(0 < t["tool_s"] <= P.tool_max_s for t in ts[:-1])
