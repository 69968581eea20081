"""Thinking-model output lengths: the math pilot's seeded distribution, reference tokens.

A thinking model answering competition math writes long reasoning, and often runs to
its ``max_new_tokens`` without an answer. Per prompt a difficulty shared by its G
members (log-normal, sigma ``difficulty_sigma``), so groups differ; per member a
log-normal draw around ``median`` x difficulty (sigma ``member_sigma``), so members
differ; every length clipped to ``min_tokens`` .. ``cap`` (the cap is SGLang's
``max_new_tokens``: the draws above it form a mass at the cap). Every draw is a
deterministic function of (prompt id, member).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from queue_rollout.lab.workloads.profile import normal


@dataclass(frozen=True)
class ThinkingParams:
    median: float = 11_000.0
    member_sigma: float = 0.5
    difficulty_sigma: float = 0.3
    cap: int = 16_384
    min_tokens: int = 256

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def thinking_lengths(prompts: int, group_size: int, p: ThinkingParams,
                     prefix: str = "boba") -> dict[str, list[int]]:
    """Prompt id -> its G members' output lengths."""
    out: dict[str, list[int]] = {}
    for i in range(prompts):
        pid = f"{prefix}-{i:04d}"
        difficulty = p.difficulty_sigma * normal("difficulty", pid)
        out[pid] = [min(p.cap, max(p.min_tokens, round(
                        p.median * math.exp(difficulty + p.member_sigma * normal("len", pid, m)))))
                    for m in range(group_size)]
    return out


def cap_share(lengths: dict[str, list[int]], cap: int) -> float:
    """The share of members at the cap."""
    members = [n for ms in lengths.values() for n in ms]
    return sum(n >= cap for n in members) / len(members)
