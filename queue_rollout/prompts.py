"""Prompts: JSON Lines, one object per line (DESIGN section 6).

Each object has ``id`` (a non-empty string, unique), ``prompt`` (a string) or
``input_ids`` (a list of ints), optionally ``answer``, ``p_correct`` and
``member_lengths`` (G positive ints); any other field is kept for the workflow. A bad
line is refused with its line number, and nothing is submitted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import BadInput


def check_prompt(obj: Any, *, group_size: int, max_bytes: int, where: str) -> tuple[str, bytes]:
    """Validate one prompt object; returns (id, canonical JSON bytes)."""
    if not isinstance(obj, dict):
        raise BadInput(f"{where}: a prompt must be a JSON object")
    pid = obj.get("id")
    if not isinstance(pid, str) or not pid:
        raise BadInput(f"{where}: `id` must be a non-empty string")
    has_text = "prompt" in obj
    has_ids = "input_ids" in obj
    if has_text == has_ids:
        raise BadInput(f"{where}: prompt {pid!r} needs exactly one of `prompt` or `input_ids`")
    if has_text and not isinstance(obj["prompt"], str):
        raise BadInput(f"{where}: prompt {pid!r}: `prompt` must be a string")
    if has_ids and not (isinstance(obj["input_ids"], list) and obj["input_ids"] and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in obj["input_ids"])):
        raise BadInput(f"{where}: prompt {pid!r}: `input_ids` must be a non-empty list of ints >= 0")
    if "member_lengths" in obj:
        lengths = obj["member_lengths"]
        if not isinstance(lengths, list) or len(lengths) != group_size:
            raise BadInput(f"{where}: prompt {pid!r}: `member_lengths` must hold "
                           f"rollout.group_size = {group_size} ints")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
            raise BadInput(f"{where}: prompt {pid!r}: `member_lengths` entries must be ints > 0")
    if "p_correct" in obj and not (isinstance(obj["p_correct"], (int, float))
                                   and not isinstance(obj["p_correct"], bool)
                                   and 0 <= obj["p_correct"] <= 1):
        raise BadInput(f"{where}: prompt {pid!r}: `p_correct` must be a number in [0, 1]")
    raw = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    if len(raw) > max_bytes:
        raise BadInput(f"{where}: prompt {pid!r} is {len(raw)} bytes, over "
                       f"limits.max_prompt_bytes = {max_bytes}")
    return pid, raw


def parse_lines(lines: Iterable[str], *, group_size: int, max_bytes: int,
                source: str = "prompts") -> list[tuple[str, bytes]]:
    """Parse JSON Lines; blank lines are skipped; duplicate ids are refused."""
    out: list[tuple[str, bytes]] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}: not valid JSON: {exc.msg}") from None
        pid, raw = check_prompt(obj, group_size=group_size, max_bytes=max_bytes, where=where)
        if pid in seen:
            raise BadInput(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})")
        seen[pid] = number
        out.append((pid, raw))
    return out


def read_file(path: str | Path, *, group_size: int, max_bytes: int) -> list[tuple[str, bytes]]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"{p}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BadInput(f"{p}: not UTF-8 text") from None
    return parse_lines(_lines(text), group_size=group_size, max_bytes=max_bytes, source=str(p))


def _lines(text: str) -> Iterator[str]:
    yield from text.splitlines()
