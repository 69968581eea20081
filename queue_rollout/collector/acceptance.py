"""Acceptance rules: whether a complete group may be trained on.

A group is rejected (and gives its staleness budget back) when more than
``acceptance.max_failed_members`` members failed, when ``reject_zero_variance`` is on
and every member that has a reward got the same one (no learning signal for
GRPO-style advantages), or when the plugin ``package.module:function`` says so: it is
called with a :class:`GroupView` and returns True to accept, False or a reason string
to reject.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from queue_rollout.config import AcceptanceConfig, load_reference
from queue_rollout.results import EpisodeResult


@dataclass(frozen=True)
class GroupView:
    id: str
    prompt: dict[str, Any]
    failed: int
    results: list[EpisodeResult | None]  # by member; None where the member failed without one

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.results if r is not None and not r.error
                and r.reward is not None]


Plugin = Callable[[GroupView], "bool | str"]


def load_plugin(ref: str) -> Plugin | None:
    if not ref:
        return None
    return typing.cast(Plugin, load_reference(ref, "acceptance.plugin"))


def verdict(group: GroupView, rules: AcceptanceConfig, plugin: Plugin | None) -> tuple[str, str]:
    """``("", "")`` to accept, else (reason label, detail) to reject."""
    if group.failed > rules.max_failed_members:
        return "failed_members", (f"{group.failed} failed members > "
                                  f"max_failed_members = {rules.max_failed_members}")
    rewards = group.rewards
    if rules.reject_zero_variance and len(rewards) >= 1 and len(set(rewards)) == 1:
        return "zero_variance", f"all rewards {rewards[0]}"
    if plugin is not None:
        answer = plugin(group)
        if answer is not True:
            return "plugin", answer if isinstance(answer, str) else "plugin rejected"
    return "", ""
