"""The farm's history of group shapes: what ``plan --from-farm`` replays.

Each finished member's report carries its shape (:func:`member_shape`): its prompt's
tokens and, per model call, the tokens generated, the seconds of the tool wait after
it and the tokens the tool added to the context. When a group completes with a shape
from every member (a failed member leaves none), ``finish`` pushes the group's shape
onto a list that keeps the newest :data:`SHAPES_KEPT` groups. The shapes are in the
format of ``plan --workload`` files, with their group ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from queue_rollout.ledger.keys import Keys

#: Group shapes the history keeps (newest first): about 0.4 kB a single-call group of 8,
#: up to tens of kB for long multi-turn episodes.
SHAPES_KEPT = 4096


def member_shape(prompt_tokens: int, gens: Sequence[int], tool_s: Sequence[float] = (),
                 context_tokens: Sequence[int] = ()) -> str:
    """A finished member's shape as JSON: one call without a tool is its output
    tokens, else its calls. *tool_s*: the tool seconds after each call (missing: 0);
    *context_tokens*: each call's context tokens as the replica counted them, from
    which each tool's added tokens are inferred (the next call's context less this
    call's context and output)."""
    calls = []
    for t, gen in enumerate(gens):
        seconds = tool_s[t] if t < len(tool_s) else 0.0
        added = (max(0, context_tokens[t + 1] - context_tokens[t] - gen)
                 if t + 1 < len(context_tokens) else 0)
        calls.append({"gen": int(gen), "tool_s": round(float(seconds), 3),
                      "tool_tokens": int(added)})
    shape: dict[str, Any] = {"prompt_tokens": max(1, int(prompt_tokens))}
    if len(calls) == 1 and not calls[0]["tool_s"] and not calls[0]["tool_tokens"]:
        shape["output_tokens"] = calls[0]["gen"]
    else:
        shape["turns"] = calls
    return json.dumps(shape, separators=(",", ":"))


def recorded_shapes(client: redis.Redis, keys: Keys) -> list[dict[str, Any]]:
    """The history, oldest first, each as a workload line: ``group_id``,
    ``prompt_tokens`` (member 0's) and ``members``."""
    out = []
    for raw in reversed(client.lrange(keys.shapes, 0, -1)):
        entry = json.loads(raw)
        members = entry["members"]
        out.append({"group_id": entry["group_id"],
                    "prompt_tokens": members[0].get("prompt_tokens", 1),
                    "members": [{k: v for k, v in m.items() if k != "prompt_tokens"}
                                for m in members]})
    return out


def shapes_kept(client: redis.Redis, keys: Keys) -> int:
    return int(client.llen(keys.shapes))
