"""The ideal schedule of a policy: the ledger's scripts on a real Redis and the engine
model, in virtual time, with no control-plane overhead; the settings it runs a shape
at, and the figures it is reported by. The bench's pilots set it beside each run, and
``queue-rollout plan`` compares policies on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import redis

from queue_rollout.config import EngineConfig, PauseMode, RolloutConfig
from queue_rollout.lab.sim.server import text_tokens
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.lab.virtual.farm import (
    AdaptiveSlots,
    EngineModel,
    SimFarm,
    SimReport,
    TrainerSchedule,
)
from queue_rollout.lab.virtual.figures import num, schedule_figures
from queue_rollout.lab.virtual.shape import Scale, Shape
from queue_rollout.ledger.core import Ledger
from queue_rollout.turns import member_turns


def adaptive_interval_s(scale: Scale) -> float:
    """How often a worker looks at its replica's KV room at *scale*: the shipped
    ``engine.adaptive_interval_s`` scaled by time."""
    return EngineConfig().adaptive_interval_s * scale.time


def kv_settings(shape: Shape, scale: Scale) -> dict[str, Any]:
    """The engine model's prefill and KV settings at *scale*: sizes scale with tokens,
    the prefill rate so that a prefill takes the scaled time."""
    return {"prefill_tokens_per_s": shape.prefill_tokens_per_s / scale.step_factor,
            "chunked_prefill_size": scale.length(shape.chunked_prefill_size),
            "max_total_tokens": scale.length(shape.max_total_tokens)}


def engine_model(shape: Shape, scale: Scale) -> EngineModel:
    """*shape*'s replicas at *scale*: the decode step scaled by the step factor, the
    per-context-token cost by it per token, the prefill and KV settings as
    :func:`kv_settings`."""
    s, f = shape, scale.step_factor
    return EngineModel(
        replicas=s.replicas, slots_per_replica=s.slots_per_replica,
        step_ms=s.step_ms * f, step_ms_per_request=s.step_ms_per_request * f,
        step_us_per_context_token=s.step_us_per_context_token * f / scale.tokens,
        **kv_settings(shape, scale))


def rollout_settings(shape: Shape, mode: str, max_staleness: int,
                     placement: str = "any", adaptive: bool = False) -> dict[str, object]:
    """The ``[rollout]`` section of *mode* on *shape*: group mode admits whole groups
    into the slots, sample mode one member per slot (``"auto"`` with *adaptive*
    concurrency: the workers' limits); *placement* as ``rollout.placement``."""
    rollout: dict[str, object] = {
        "group_size": shape.group_size, "batch_size": shape.batch_size,
        "max_concurrent_rollouts": shape.slots // shape.group_size,
        "max_staleness": max_staleness, "placement": placement}
    if mode == "sample":
        rollout["max_concurrent_samples"] = "auto" if adaptive else shape.slots
    return rollout


def ideal_schedule(client: redis.Redis, shape: Shape, scale: Scale,
                   prompts: list[dict[str, Any]], mode: str, max_staleness: int, farm: str,
                   *, pause_mode: PauseMode = "in_place", placement: str = "any",
                   adaptive: bool = False, ignore_eos: bool = False,
                   on_progress: Callable[[SimFarm], None] | None = None) -> SimReport:
    """The ideal schedule of a policy: the ledger's scripts on *client* under the farm
    name *farm* (a new one) and the engine model, in virtual time, with zero
    control-plane overhead. The bench's pilots and ``queue-rollout plan`` both run it.
    *ignore_eos*: as :class:`SimFarm` takes it."""
    s = shape
    clock = ManualClock()
    rollout = msgspec.convert(
        rollout_settings(shape, mode, max_staleness, placement, adaptive), RolloutConfig)
    ledger = Ledger(client, farm, rollout, clock=clock)
    episodes: dict[str, Any] = (
        {"member_turns": {p["id"]: [member_turns(m) for m in p["member_turns"]]
                          for p in prompts}}
        if "member_turns" in prompts[0] else
        {"lengths": {p["id"]: p["member_lengths"] for p in prompts}})
    return SimFarm(
        ledger, clock, **episodes,
        prompt_tokens={p["id"]: prompt_length(p) for p in prompts},
        engine=engine_model(shape, scale),
        trainer=TrainerSchedule(train_s=s.train_s * scale.time,
                                train_batches=s.train_batches, stop_after=s.stop_after,
                                pause_mode=pause_mode),
        capacity_slots=s.slots,
        adaptive=(AdaptiveSlots(s.min_slots_per_replica, adaptive_interval_s(scale))
                  if adaptive else None),
        ignore_eos=ignore_eos, on_progress=on_progress,
    ).run()


def prompt_length(prompt: dict[str, Any]) -> int:
    """The tokens a prompt puts before its output: ``prompt_tokens`` where a workload
    gives only the count, else its ``input_ids``, else its text's."""
    if "prompt_tokens" in prompt:
        return int(prompt["prompt_tokens"])
    if "input_ids" in prompt:
        return len(prompt["input_ids"])
    return len(text_tokens(prompt["prompt"]))


def ideal_json(ideal: SimReport, shape: Shape, multi_turn: bool) -> dict[str, Any]:
    """An ideal schedule's figures (the bench's ``ideal`` block, ``plan``'s rows)."""
    active = ideal.mean_in_flight if multi_turn else ideal.mean_active
    return {
        "mean_rollout_interval_s": num(ideal.mean_rollout_interval, 3),
        "all_work_completion_s": round(ideal.all_work_s, 3),
        "mean_active_episodes": round(active, 2),
        "mean_running_requests": round(ideal.mean_active, 2),
        "slot_occupancy": round(active / ideal.slots, 4),
        "gpu_busy": round(ideal.gpu_busy, 4),
        "retractions": ideal.retractions,
        "prefill_tokens": ideal.prefill_tokens,
        "prefill_tokens_cached": ideal.cached_tokens,
        **schedule_figures(ideal.ready_times, ideal.pause_ends, shape.batch_size,
                           shape.train_batches),
    }
