"""A pilot profile: a prompt manifest, per prompt the G members' output lengths in
tokens (``member_lengths``, which the ``controlled_length`` workflow produces exactly)
or their turns (``member_turns``, the ``controlled_turns`` workflow's); the
deterministic draws the manifests are made of; and a manifest's digest.

Lengths are deterministic functions of the prompt id, so both admission modes, and
every run, see the same manifest.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from queue_rollout.lab.virtual.shape import Scale, Shape


def unit(*parts: object) -> float:
    """A deterministic number in (0, 1) from *parts*."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2**64


def normal(*parts: object) -> float:
    """A deterministic standard normal draw from *parts* (Box-Muller)."""
    u1, u2 = unit("u1", *parts), unit("u2", *parts)
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


@dataclass(frozen=True)
class Profile:
    """A pilot: its episodes, as ``member_lengths`` (*lengths*, one request each) or as
    ``member_turns`` (*turns*: multi-turn, reference tokens and seconds); optionally a
    shape and scale of its own, the seed's figures beside which it reports, and what
    was fitted to calibrate it."""

    name: str
    summary: str
    lengths: Callable[[int, int], dict[str, list[int]]] | None = None  # (prompts, G) ->
    turns: Callable[[int, int], dict[str, list[Any]]] | None = None  # (prompts, G) ->
    prompt_tokens: int = 0  # each group's prompt, reference tokens (0: a short text)
    shape: Shape | None = None
    scale: Scale | None = None
    seed: Mapping[str, Any] | None = None
    calibration: Mapping[str, Any] | None = None

    def manifest(self, shape: Shape, scale: Scale) -> list[dict[str, Any]]:
        """The prompts, with lengths (and tool times) scaled to *scale*."""
        if self.turns is not None:
            return [{"id": pid, **self._prompt(pid, scale),
                     "member_turns": [_scale_member(m, scale) for m in members]}
                    for pid, members in self.turns(shape.prompts, shape.group_size).items()]
        if self.lengths is None:
            raise ValueError(f"profile {self.name}: neither lengths nor turns")
        return [{"id": pid, **self._prompt(pid, scale),
                 "member_lengths": [scale.length(n) for n in lengths]}
                for pid, lengths in self.lengths(shape.prompts, shape.group_size).items()]

    def _prompt(self, pid: str, scale: Scale) -> dict[str, Any]:
        if not self.prompt_tokens:
            return {"prompt": f"{self.name} prompt {pid}"}
        first = int(unit("prompt", pid) * 2**20)  # its own ids: groups share no prefix
        return {"input_ids": list(range(first, first + scale.length(self.prompt_tokens)))}


def _scale_member(member: Any, scale: Scale) -> Any:
    """One ``member_turns`` entry at *scale*: tokens by ``tokens``, tool seconds by
    ``time``."""
    if isinstance(member, dict):
        return {**member, "turns": _scale_member(member["turns"], scale)}
    out = []
    for turn in member:
        scaled = {"gen": scale.length(turn["gen"])}
        if "tool_s" in turn:
            scaled["tool_s"] = turn["tool_s"] * scale.time
        if turn.get("tool_tokens"):
            scaled["tool_tokens"] = scale.length(turn["tool_tokens"])
        out.append(scaled)
    return out


def manifest_digest(prompts: list[dict[str, Any]]) -> str:
    """A digest of a manifest, independent of order: what both modes must share."""
    lines = sorted(json.dumps(p, sort_keys=True) for p in prompts)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
