"""What ``queue-rollout plan`` runs: a prompt manifest in the bench's form.

A workload is a bench profile's manifest, or groups sampled from a file of group
shapes, one JSON object a line::

    {"prompt_tokens": 2048, "members": [{"output_tokens": 731}, {"turns": [
        {"gen": 180, "tool_s": 4.2, "tool_tokens": 600}, {"gen": 95}]}, ...]}

``prompt_tokens`` (default 1) is the group's prompt; each member is one request of
``output_tokens``, or model calls (``turns``: ``gen`` tokens each, then ``tool_s``
seconds of tool time whose output, ``tool_tokens``, joins the context). Whole groups
are sampled, with replacement, by a seeded generator: sampling members independently
would invent spread inside groups, and that spread is what sample-level refill feeds on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from queue_rollout.errors import BadInput
from queue_rollout.lab.virtual.shape import Scale


class WorkloadError(BadInput):
    """A workload file or farm history that cannot be planned on (exit 2)."""


def read_shapes(path: Path) -> list[dict[str, Any]]:
    """Every group shape in *path*, checked; a bad line raises naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"workload {path}: {exc.strerror or exc}") from None
    shapes = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"workload {path} line {n}: not JSON ({exc.msg})") from None
        try:
            shapes.append(check_shape(raw))
        except ValueError as exc:
            raise WorkloadError(f"workload {path} line {n}: {exc}") from None
    if not shapes:
        raise WorkloadError(f"workload {path}: no group shapes in it")
    sizes = {len(s["members"]) for s in shapes}
    if len(sizes) > 1:
        raise WorkloadError(f"workload {path}: groups of different sizes {sorted(sizes)}; "
                            "a farm has one group_size")
    return shapes


def farm_shapes(farm: str, recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shapes farm *farm* recorded (``finish`` keeps them as groups complete),
    checked as a workload file's lines are."""
    if not recorded:
        raise WorkloadError(f"farm {farm}: no group shapes kept yet (a group's shape is "
                            "kept when it completes with every member finished)")
    shapes = []
    for entry in recorded:
        try:
            shapes.append(check_shape(entry))
        except ValueError as exc:
            raise WorkloadError(f"farm {farm}: group {entry.get('group_id')!r}: {exc}") from None
    if len({len(s["members"]) for s in shapes}) > 1:
        raise WorkloadError(f"farm {farm}: groups of different sizes in its history")
    return shapes


def _count(value: object, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def check_shape(raw: object) -> dict[str, Any]:
    """One group shape, normalized: ``prompt_tokens`` and each member's ``turns``
    (``gen``, ``tool_s``, ``tool_tokens``). ValueError says what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError("a group shape is a JSON object")
    unknown = set(raw) - {"prompt_tokens", "members", "group_id"}
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}")
    prompt = _count(raw.get("prompt_tokens", 1), "prompt_tokens", minimum=1)
    members = raw.get("members")
    if not isinstance(members, list) or not members:
        raise ValueError("members must be a non-empty list")
    out = []
    for m, member in enumerate(members):
        if not isinstance(member, dict) or ("output_tokens" in member) == ("turns" in member):
            raise ValueError(f"member {m}: give exactly one of output_tokens and turns")
        if "output_tokens" in member:
            out.append([{"gen": _count(member["output_tokens"], f"member {m} output_tokens",
                                       minimum=1), "tool_s": 0.0, "tool_tokens": 0}])
            continue
        turns = member["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"member {m}: turns must be a non-empty list")
        calls = []
        for t, turn in enumerate(turns):
            where = f"member {m} turn {t}"
            if not isinstance(turn, dict) or set(turn) - {"gen", "tool_s", "tool_tokens"}:
                raise ValueError(f"{where}: an object of gen, tool_s, tool_tokens")
            tool_s = turn.get("tool_s", 0.0)
            if isinstance(tool_s, bool) or not isinstance(tool_s, int | float) or not (
                    0 <= tool_s < float("inf")):
                raise ValueError(f"{where}: tool_s must be a number >= 0, got {tool_s!r}")
            calls.append({"gen": _count(turn.get("gen"), f"{where} gen", minimum=1),
                          "tool_s": float(tool_s),
                          "tool_tokens": _count(turn.get("tool_tokens", 0),
                                                f"{where} tool_tokens", minimum=0)})
        out.append(calls)
    return {"prompt_tokens": prompt, "members": out}


def sample_manifest(shapes: list[dict[str, Any]], groups: int, seed: int,
                    scale: Scale) -> list[dict[str, Any]]:
    """*groups* prompts, each a whole group shape drawn from *shapes* by *seed*, with
    tokens and tool seconds at *scale*. Single-call members stay ``member_lengths``
    unless some member makes several calls (then every member is ``member_turns``)."""
    rng = random.Random(seed)
    picks = [shapes[rng.randrange(len(shapes))] for _ in range(groups)]
    multi = any(len(turns) > 1 or turns[0]["tool_s"] or turns[0]["tool_tokens"]
                for s in picks for turns in s["members"])
    manifest = []
    for i, shape in enumerate(picks):
        prompt: dict[str, Any] = {"id": f"w-{i:06d}",
                                  "prompt_tokens": scale.length(shape["prompt_tokens"])}
        if multi:
            prompt["member_turns"] = [
                [{"gen": scale.length(t["gen"]), "tool_s": t["tool_s"] * scale.time,
                  "tool_tokens": scale.length(t["tool_tokens"]) if t["tool_tokens"] else 0}
                 for t in turns] for turns in shape["members"]]
        else:
            prompt["member_lengths"] = [scale.length(turns[0]["gen"])
                                        for turns in shape["members"]]
        manifest.append(prompt)
    return manifest
