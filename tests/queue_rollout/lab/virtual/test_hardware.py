"""The GPU profile's constants come from the H200 tables kept in the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queue_rollout.lab.virtual.hardware import CPU_SGLANG, H200, fit_decode, prefill_rate
from queue_rollout.lab.virtual.shape import Shape

ASSETS = Path(__file__).resolve().parents[4] / "docs" / "assets"
TABLES = ASSETS / "gpu" / "h200"


def table(name: str) -> dict:
    return json.loads((TABLES / name).read_text())


def test_the_h200_constants_are_the_decode_grids_least_squares_and_its_8192_token_prefill():
    decode = table("h200_decode.json")
    a, b, c = fit_decode(decode["decode"])
    assert a == pytest.approx(H200.step_ms, rel=1e-4)
    assert b == pytest.approx(H200.step_ms_per_request, rel=1e-4)
    assert c == pytest.approx(H200.step_us_per_context_token, rel=1e-4)
    # the fit the measurement itself stored agrees with ours
    assert a == pytest.approx(decode["fit"]["a_ms"], rel=1e-9)
    assert c / 1000 == pytest.approx(decode["fit"]["c_ctx_ms"], rel=1e-9)
    assert prefill_rate(decode["prefill"], Shape().chunked_prefill_size) == pytest.approx(
        H200.prefill_tokens_per_s, rel=1e-4)


def test_the_profile_predicts_every_measured_decode_step_within_its_stated_error():
    decode = table("h200_decode.json")
    for p in decode["decode"] + decode["decode_extra"]:
        model = (H200.step_ms + H200.step_ms_per_request * p["b"]
                 + H200.step_us_per_context_token * p["b"] * p["c"] / 1000)
        assert model == pytest.approx(p["ms"], rel=0.042), p


def test_fit_decode_recovers_known_constants_and_refuses_too_few_points():
    points = [{"b": b, "c": c, "ms": 2.0 + 0.5 * b + 0.003 * b * c / 1000}
              for b in (1, 4, 16) for c in (100, 1000)]
    assert fit_decode(points) == pytest.approx((2.0, 0.5, 0.003))
    with pytest.raises(ValueError):
        fit_decode(points[:2])
    with pytest.raises(ValueError):
        prefill_rate([], 8192)


def test_a_gpu_profile_replaces_only_the_engine_constants():
    shape = H200.shape(Shape(prompts=7))
    assert shape.prompts == 7 and shape.step_ms == H200.step_ms
    assert shape.prefill_tokens_per_s == H200.prefill_tokens_per_s
    assert shape.max_total_tokens == Shape().max_total_tokens


def test_the_cpu_constants_are_the_real_sglang_benchs_long_tail_calibration():
    real = json.loads((ASSETS / "bench" / "real-sglang.json").read_text())
    fitted = next(w["calibration"] for w in real["workloads"] if w["profile"] == "long-tail")
    assert CPU_SGLANG.step_ms == fitted["step_ms"]
    assert CPU_SGLANG.step_ms_per_request == fitted["step_ms_per_request"]
    assert CPU_SGLANG.step_us_per_context_token == fitted["step_us_per_context_token"]
    assert CPU_SGLANG.prefill_tokens_per_s == real["prefill_tokens_per_s"]
