"""Agentic episodes for the ``controlled_turns`` workflow: a seeded distribution of
turns, in reference tokens and seconds.

Each prompt (an agent task) has a difficulty shared by its G members, so groups
differ; each member draws its own turns from it, so members of a group differ as
real agent runs do. Per member:

- turns: log-normal around ``turns_median`` x the prompt's difficulty (sigma
  ``turns_sigma``), 1 to ``max_turns``;
- per turn, generated tokens: log-normal around ``gen_median`` (sigma ``gen_sigma``),
  ``gen_min`` to ``gen_max``; then a tool: seconds log-normal around ``tool_median_s``
  (sigma ``tool_sigma``), at most ``tool_max_s``, and its output tokens log-normal around
  ``tool_tokens_median`` (sigma ``tool_tokens_sigma``), at most ``tool_tokens_max``; the
  last turn runs no tool (the agent has answered);
- with probability ``harness_share`` the member is a harness failure: it runs its
  turns and is consumed with reward 0 (``{"turns": ..., "harness_error": true}``).

The prompt's difficulty is log-normal with sigma ``difficulty_sigma``. Every draw is a
deterministic function of (prompt id, member, turn), so both admission modes and every
run see the same manifest.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from queue_rollout.lab.workloads.profile import normal, unit


@dataclass(frozen=True)
class AgenticParams:
    turns_median: float = 20.0
    turns_sigma: float = 0.6
    max_turns: int = 100
    difficulty_sigma: float = 0.4
    gen_median: float = 300.0
    gen_sigma: float = 0.6
    gen_min: int = 16
    gen_max: int = 4096
    tool_median_s: float = 10.0
    tool_sigma: float = 1.0
    tool_max_s: float = 600.0
    tool_tokens_median: float = 500.0
    tool_tokens_sigma: float = 1.0
    tool_tokens_max: int = 8000
    harness_share: float = 0.05

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def member_turns(pid: str, member: int, p: AgenticParams) -> list[dict[str, Any]]:
    """One member's turns ``{"gen", "tool_s", "tool_tokens"}``, reference units."""
    difficulty = math.exp(p.difficulty_sigma * normal("difficulty", pid))
    n = round(p.turns_median * difficulty * math.exp(p.turns_sigma * normal("turns", pid,
                                                                              member)))
    n = min(p.max_turns, max(1, n))
    turns = []
    for t in range(n):
        gen = round(p.gen_median * math.exp(p.gen_sigma * normal("gen", pid, member, t)))
        turn: dict[str, Any] = {"gen": min(p.gen_max, max(p.gen_min, gen))}
        if t < n - 1:
            tool = p.tool_median_s * math.exp(p.tool_sigma * normal("tool", pid, member, t))
            out = p.tool_tokens_median * math.exp(
                p.tool_tokens_sigma * normal("out", pid, member, t))
            turn["tool_s"] = round(min(p.tool_max_s, tool), 3)
            turn["tool_tokens"] = min(p.tool_tokens_max, round(out))
        turns.append(turn)
    return turns


def agentic_manifest(prompts: int, group_size: int, p: AgenticParams,
                     prefix: str = "swe") -> dict[str, list[Any]]:
    """Prompt id -> ``member_turns`` (G members: lists of turns, or harness failures as
    ``{"turns": [...], "harness_error": true}``)."""
    out: dict[str, list[Any]] = {}
    for i in range(prompts):
        pid = f"{prefix}-{i:04d}"
        members: list[Any] = []
        for m in range(group_size):
            turns = member_turns(pid, m, p)
            harness = unit("harness", pid, m) < p.harness_share
            members.append({"turns": turns, "harness_error": True} if harness else turns)
        out[pid] = members
    return out
