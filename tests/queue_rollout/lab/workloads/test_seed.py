"""The seed's workload profiles: their shapes, scales, seed figures and calibration
blocks, and their manifests at a scale."""

from __future__ import annotations

import pytest

from queue_rollout.lab.workloads.seed import SEED_PILOTS


def test_the_seed_profiles_carry_their_shape_scale_seed_and_calibration():
    swe, boba, b8 = (SEED_PILOTS[n]() for n in ("swe-agentic", "boba-math", "boba-math-b8"))
    assert swe.shape and swe.shape.prompts == 192 and swe.shape.stop_after == 10
    assert swe.shape.train_batches == 0 and swe.shape.slots == 128
    assert boba.shape and boba.shape.batch_size == 16 and boba.shape.train_batches == 6
    assert b8.shape and b8.shape.batch_size == 8 and b8.shape.slots == 128
    assert boba.lengths and b8.lengths and boba.lengths(128, 8) == b8.lengths(128, 8)
    for p in (swe, boba, b8):
        assert p.seed and "group" in p.seed and p.calibration and p.calibration["fitted"]
    # B8 runs the lengths fitted at B16, with no targets of its own to be judged on
    assert b8.calibration["fitted"] == boba.calibration["fitted"]
    assert "targets" not in b8.calibration and b8.calibration["fitted_on"] == "boba-math"
    assert boba.calibration["targets"]["mean_rollout_interval_s"] == 105.2
    assert set(swe.calibration["fitted"]) == {"tool_median_s", "gen_median", "turns_sigma",
                                              "difficulty_sigma"}
    # the manifest at a scale: prompt ids of its own per group, turns scaled
    assert swe.scale is not None
    prompts = swe.manifest(swe.shape, swe.scale)
    assert len(prompts) == 192 and len(prompts[0]["input_ids"]) == 256
    assert prompts[0]["input_ids"][0] != prompts[1]["input_ids"][0]
    raw = swe.turns(192, 8)["swe-0000"][0] if swe.turns else None
    first = prompts[0]["member_turns"][0]
    turns = first["turns"] if isinstance(first, dict) else first
    raw_turns = raw["turns"] if isinstance(raw, dict) else raw
    assert turns[0]["gen"] == swe.scale.length(raw_turns[0]["gen"])
    assert turns[0]["tool_s"] == pytest.approx(raw_turns[0]["tool_s"] * swe.scale.time)
