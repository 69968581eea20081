"""The seed's two workload pilots, modelled: agentic SWE-bench episodes and Boba math
with a thinking model. Each is a :class:`~.profile.Profile` with its own shape and
scale, the seed's figures to report beside, and its calibration: the parameters fitted,
in virtual time, so that *group admission* lands on the seed's baseline (the bench's
``--refit`` fits them again); sample refill is then a prediction, never fitted.

- ``swe-agentic``: B16 x G8, 128 slots, 192 prompts, rolling consumption to batch 10
  (version + 1 per batch, no pause). Episodes from :mod:`~.agentic`; fitted to the
  baseline's first batch, steady accepted groups/hour, active episodes and NVML GPU
  utilization (the share of time a replica computes anything).
- ``boba-math`` / ``boba-math-b8``: B16 (B8) x G8, 128 slots, 128 prompts, a 10 s
  pause after each of 6 batches, then drain; lengths from :mod:`~.thinking`; fitted to
  the B16 baseline's mean output and mean rollout interval; B8 uses the same lengths.

The engine model is the calibrated one of the controlled-length pilot (same GPUs and
model family): a decode step of 4.5 ms + 0.2 ms per running request, prefill 20,000
tokens/s, and a KV pool of 220,000 tokens (an L20-class 48 GB card at memory fraction
0.85 less Qwen3-4B's weights, 144 KiB of KV per token).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.lab.workloads.agentic import AgenticParams, agentic_manifest
from queue_rollout.lab.workloads.profile import Profile
from queue_rollout.lab.workloads.thinking import ThinkingParams, cap_share, thinking_lengths

SWE_SHAPE = Shape(prompts=192, train_s=0.0, train_batches=0, stop_after=10)
SWE_SCALE = Scale(time=1 / 60, tokens=0.125)
SWE_PROMPT_TOKENS = 2048  # system prompt, tool descriptions and the issue
#: The fitted parameters (``queue-rollout bench --profile swe-agentic --refit``).
SWE_PARAMS = AgenticParams(tool_median_s=4.7433, gen_median=188.87, turns_sigma=0.7255,
                           difficulty_sigma=0.9456)
#: The same four fitted under the H200 engine profile
#: (``queue-rollout bench --profile gpu-h200 --refit``).
SWE_PARAMS_H200 = AgenticParams(tool_median_s=5.9710, gen_median=271.61, turns_sigma=0.6185,
                                difficulty_sigma=0.5952)
SWE_FITTED = ("tool_median_s", "gen_median", "turns_sigma", "difficulty_sigma")
SWE_TARGETS = {"first_batch_s": 10.24 * 60, "accepted_groups_per_hour": 73.82,
               "mean_active_episodes": 55.62, "gpu_busy": 0.6899}
SWE_SEED = {
    "group": {"batches_ready_s": 127.29 * 60, "steady_window_s": 117.05 * 60,
              "accepted_groups_per_hour": 73.82, "median_batch_interval_s": 625.64,
              "first_batch_s": 10.24 * 60, "mean_active_episodes": 55.62,
              "gpu_busy": 0.6899, "sm_active": 0.3567},
    "sample": {"batches_ready_s": 101.24 * 60, "steady_window_s": 90.68 * 60,
               "accepted_groups_per_hour": 95.28, "median_batch_interval_s": 566.63,
               "first_batch_s": 10.55 * 60, "mean_active_episodes": 121.67,
               "gpu_busy": 0.8631, "sm_active": 0.5007},
    "note": "Qwen3-4B-Instruct-2507, eight L20X GPUs, one TP1 SGLang replica each; one "
            "paired run; 63 vs 73 harness failures among the consumed episodes",
}

BOBA_SHAPE = Shape()  # B16 x G8, 128 prompts, 10 s pause after each of 6 batches
BOBA_B8_SHAPE = Shape(batch_size=8)
BOBA_SCALE = Scale(time=0.1, tokens=0.125)
#: The fitted parameters (``queue-rollout bench --profile boba-math --refit``).
BOBA_PARAMS = ThinkingParams(median=10_258.0, member_sigma=0.4126)
#: The same two fitted under the H200 engine profile
#: (``queue-rollout bench --profile gpu-h200 --refit``).
BOBA_PARAMS_H200 = ThinkingParams(median=10_345.6, member_sigma=0.5638)
BOBA_FITTED = ("median", "member_sigma")
BOBA_TARGETS = {"mean_output_tokens": 10_729.01, "mean_rollout_interval_s": 105.20}
BOBA_SEED = {
    "group": {"mean_rollout_interval_s": 105.20, "mean_cycle_s": 116.22,
              "mean_output_tokens": 10_729.01},
    "sample": {"mean_rollout_interval_s": 95.13, "mean_cycle_s": 106.15,
               "mean_output_tokens": 10_573.39},
    "change": {"mean_rollout_interval_s": -0.096, "mean_cycle_s": -0.087,
               "accepted_groups_per_hour": 0.106, "complete_candidates_s": -0.042},
    "note": "Qwen3-4B thinking, max 16,384 new tokens, eight L20X GPUs, memory "
            "fraction 0.85; one paired run",
}
BOBA_B8_SEED = {
    "group": {"mean_rollout_interval_s": 54.35},
    "sample": {"mean_rollout_interval_s": 55.41},
    "change": {"mean_rollout_interval_s": 0.019},
    "note": "B8 x G8 at the same 128 slots: the seed's case where refill was slower",
}


def swe_profile(params: AgenticParams = SWE_PARAMS,
                calibration: Mapping[str, Any] | None = None) -> Profile:
    return Profile(
        "swe-agentic", "agentic SWE episodes: seeded turns, tool waits and tool output, "
                       "members differing, a share of harness failures; rolling to batch 10",
        turns=lambda prompts, g: agentic_manifest(prompts, g, params),
        prompt_tokens=SWE_PROMPT_TOKENS, shape=SWE_SHAPE, scale=SWE_SCALE, seed=SWE_SEED,
        calibration=calibration if calibration is not None else {
            "fitted": {k: getattr(params, k) for k in SWE_FITTED},
            "fixed": {k: v for k, v in params.as_json().items() if k not in SWE_FITTED}
            | {"prompt_tokens": SWE_PROMPT_TOKENS},
            "targets": SWE_TARGETS,
            "how": "group admission's ideal schedule, virtual time; refit with "
                   "`queue-rollout bench --profile swe-agentic --refit`"})


def boba_profile(name: str = "boba-math", params: ThinkingParams = BOBA_PARAMS,
                 calibration: Mapping[str, Any] | None = None) -> Profile:
    b8 = name == "boba-math-b8"
    lengths = thinking_lengths(BOBA_SHAPE.prompts, BOBA_SHAPE.group_size, params)
    return Profile(
        name, f"Boba math, thinking lengths (mean {_mean(lengths):,.0f} tokens, "
              f"{cap_share(lengths, params.cap):.0%} at the {params.cap:,} cap)"
              + (", B8 at the same 128 slots" if b8 else ""),
        lengths=lambda prompts, g: thinking_lengths(prompts, g, params),
        shape=BOBA_B8_SHAPE if b8 else BOBA_SHAPE, scale=BOBA_SCALE,
        seed=BOBA_B8_SEED if b8 else BOBA_SEED,
        calibration=calibration if calibration is not None else {
            "fitted": {k: getattr(params, k) for k in BOBA_FITTED},
            "fixed": {k: v for k, v in params.as_json().items() if k not in BOBA_FITTED},
            "cap_share": round(cap_share(lengths, params.cap), 4),
            # B8 runs the lengths fitted at B16: its own baseline is a prediction too
            **({"fitted_on": "boba-math"} if b8 else {"targets": BOBA_TARGETS}),
            "how": "boba-math's group admission (B16), ideal schedule, virtual time; "
                   "refit with `queue-rollout bench --profile boba-math --refit`"})


def _mean(lengths: dict[str, list[int]]) -> float:
    members = [n for ms in lengths.values() for n in ms]
    return sum(members) / len(members)


SEED_PILOTS: dict[str, Callable[[], Profile]] = {
    "swe-agentic": swe_profile,
    "boba-math": boba_profile,
    "boba-math-b8": lambda: boba_profile("boba-math-b8"),
}
