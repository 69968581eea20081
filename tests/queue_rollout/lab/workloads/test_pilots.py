"""The synthetic pilots: deterministic manifests shaped as documented; the long tail's
members wherever it is used."""

from __future__ import annotations

from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.pilots import (
    KV_PRESSURE,
    LONG_PROMPT,
    PILOTS,
    long_tail_lengths,
)
from queue_rollout.lab.workloads.profile import manifest_digest


def test_profiles_are_deterministic_and_shaped_as_documented():
    shape, scale = Shape(), Scale(time=1, tokens=1)
    for profile in PILOTS.values():
        a, b = profile.manifest(shape, scale), profile.manifest(shape, scale)
        assert a == b and len(a) == 128 and manifest_digest(a) == manifest_digest(b)
        assert all(len(p["member_lengths"]) == 8 for p in a)
    long_tail = PILOTS["long-tail"].manifest(shape, scale)
    for i, p in enumerate(long_tail):
        assert p["member_lengths"][i % 8] == 16384
        assert sorted(p["member_lengths"]) == [1024] * 7 + [16384]
    assert all(p["member_lengths"] == [4096] * 8 for p in PILOTS["equal"].manifest(shape, scale))
    between = PILOTS["group-between"].manifest(shape, scale)
    assert all(len(set(p["member_lengths"])) == 1 for p in between)
    assert len({p["member_lengths"][0] for p in between}) == 4  # 1,024 .. 8,192
    mixed = PILOTS["mixed-tail"].manifest(shape, scale)
    assert all(256 <= n <= 16384 for p in mixed for n in p["member_lengths"])
    assert sum(len(set(p["member_lengths"])) > 1 for p in mixed) > 100  # members differ


def test_the_long_tail_rotates_its_long_member_under_any_lengths_and_names():
    lengths = long_tail_lengths(5, 4, short=3, long=24, prefix="x")
    assert list(lengths) == ["x-0000", "x-0001", "x-0002", "x-0003", "x-0004"]
    assert [members.index(24) for members in lengths.values()] == [0, 1, 2, 3, 0]
    assert all(sorted(members) == [3, 3, 3, 24] for members in lengths.values())
    assert list(long_tail_lengths(1, 8)) == ["lt-0000"]


def test_the_multi_run_pilots_take_the_long_tails_members():
    shape, scale = Shape(prompts=4), Scale(time=1, tokens=1)
    members = [p["member_lengths"] for p in PILOTS["long-tail"].manifest(shape, scale)]
    for profile in (LONG_PROMPT, KV_PRESSURE):
        assert [p["member_lengths"] for p in profile.manifest(shape, scale)] == members
    assert len(LONG_PROMPT.manifest(shape, scale)[0]["input_ids"]) == 4096
    assert KV_PRESSURE.shape is not None and KV_PRESSURE.shape.max_total_tokens == 8 * 16384
