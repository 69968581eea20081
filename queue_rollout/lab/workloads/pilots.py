"""The synthetic pilots: prompt manifests of controlled output lengths.

- ``long-tail``: per group seven 1,024-token episodes and one 16,384-token one, its
  position rotating by prompt (the reference's controlled profile).
- ``equal``: eight 4,096-token episodes (the reference's control).
- ``group-between``: groups differ, members within a group are equal: 1,024 x 2^k
  tokens, k in 0..3 by a hash of the prompt id.
- ``mixed-tail``: both: a group median of 1,024 x 2^k (k in 0..2 by the prompt id),
  each member log-normal around it (sigma 0.8), clipped to 256..16,384.
- ``long-prompt``: the long tail's outputs, each group with a 4,096-token prompt of its
  own (where a group's members run decides how often its prompt is computed).
- ``kv-pressure``: the long tail's outputs over replicas whose KV pool holds 8 x
  16,384 tokens, with a staleness window of 7 (fixed slots against adaptive
  concurrency when memory is short).
"""

from __future__ import annotations

import math

from queue_rollout.lab.virtual.shape import Shape
from queue_rollout.lab.workloads.profile import Profile, unit

#: The long tail's members, reference tokens: G-1 short ones and one long one.
LONG_TAIL_SHORT, LONG_TAIL_LONG = 1024, 16384


def long_tail_lengths(prompts: int, group_size: int, short: int = LONG_TAIL_SHORT,
                      long: int = LONG_TAIL_LONG, prefix: str = "lt"
                      ) -> dict[str, list[int]]:
    """Per group: G-1 short episodes and one long one, its position rotating by prompt;
    the prompts are named ``<prefix>-0000`` on."""
    return {f"{prefix}-{i:04d}": [long if m == i % group_size else short
                                  for m in range(group_size)]
            for i in range(prompts)}


def _equal(prompts: int, g: int) -> dict[str, list[int]]:
    return {f"eq-{i:04d}": [4096] * g for i in range(prompts)}


def _group_between(prompts: int, g: int) -> dict[str, list[int]]:
    out = {}
    for i in range(prompts):
        pid = f"gb-{i:04d}"
        out[pid] = [1024 * 2 ** int(unit("gb", pid) * 4)] * g
    return out


def _mixed_tail(prompts: int, g: int) -> dict[str, list[int]]:
    out = {}
    for i in range(prompts):
        pid = f"mt-{i:04d}"
        median = 1024 * 2 ** int(unit("mt", pid) * 3)
        lengths = []
        for m in range(g):
            u1, u2 = unit("mt1", pid, m), unit("mt2", pid, m)
            z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
            lengths.append(min(16384, max(256, round(median * math.exp(0.8 * z)))))
        out[pid] = lengths
    return out


_MEMBERS = f"7 x {LONG_TAIL_SHORT:,} + 1 x {LONG_TAIL_LONG:,} tokens"

#: The pilots of one run per admission mode.
PILOTS: dict[str, Profile] = {p.name: p for p in (
    Profile("long-tail", f"per group {_MEMBERS}, the long one rotating",
            lengths=long_tail_lengths),
    Profile("equal", "8 x 4,096 tokens per group", lengths=_equal),
    Profile("group-between", "groups differ (1,024 to 8,192 tokens), members equal",
            lengths=_group_between),
    Profile("mixed-tail", "group medians 1,024 to 4,096 tokens, members log-normal "
            "around them (256 to 16,384)", lengths=_mixed_tail),
)}

LONG_PROMPT = Profile(
    "long-prompt", f"4,096-token prompts, one per group; members {_MEMBERS}",
    lengths=long_tail_lengths, prompt_tokens=4096)

KV_PRESSURE = Profile(
    "kv-pressure", f"members {_MEMBERS}; a KV pool of 8 x {LONG_TAIL_LONG:,} tokens "
    "per replica", lengths=long_tail_lengths,
    shape=Shape(max_total_tokens=8 * LONG_TAIL_LONG, max_staleness=7))
