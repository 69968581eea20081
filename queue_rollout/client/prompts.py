"""Prompts: JSON Lines, one object per line.

Each object has ``id`` (a non-empty string, unique), ``prompt`` (a string) or
``input_ids`` (a list of ints), optionally ``answer``, ``p_correct``,
``member_lengths`` (G positive ints) and ``member_turns`` (G members' turns, see
:func:`check_member_turns`); any other field is kept for the workflow. A bad line is
refused with its line number, and nothing is submitted.

Lines are separated by ``\\n`` (a ``\\r`` before it is dropped), as in JSON Lines:
U+2028 and other characters ``str.splitlines`` would split on may appear inside a
JSON string. A UTF-8 byte order mark at the start of a file is ignored.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from queue_rollout.errors import BadInput

#: At most this many known ids are named when the farm refuses a submission.
SHOWN_IDS = 10
#: ``limits.max_turns``'s default: turns of one member in ``member_turns``.
MAX_TURNS = 256
_TURN_KEYS = frozenset({"gen", "tool_s", "tool_tokens"})
_MEMBER_KEYS = frozenset({"turns", "harness_error", "reward"})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _canonical(obj: dict[str, Any], pid: str, where: str) -> bytes:
    """Compact JSON bytes; refuses what is not JSON (NaN, lone surrogates, sets, ...)."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()
    except UnicodeEncodeError:
        why = "a lone surrogate (\\ud800-\\udfff) is not Unicode text"
    except RecursionError:
        why = "nested too deeply"
    except ValueError as exc:  # NaN, an int over 4300 digits, a circular reference
        text = str(exc)
        why = ("NaN and infinities are not JSON" if text.startswith("Out of range float")
               else "an integer has too many digits" if "digits" in text else text)
    except TypeError as exc:  # a set, bytes, a tuple as a key, ...
        why = str(exc)
    raise BadInput(f"{where}: prompt {pid!r} is not JSON: {why}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_member_turns(value: Any, *, group_size: int, max_turns: int) -> str | None:
    """What is wrong with a ``member_turns`` field, or None. It holds *group_size*
    members; a member is a list of 1 to *max_turns* turns, or an object ``{"turns":
    [...], "harness_error": bool, "reward": number}`` (the last two optional); a turn
    is ``{"gen": int >= 0, "tool_s": seconds >= 0, "tool_tokens": int >= 0}`` (the last
    two optional, default 0)."""
    if not isinstance(value, list) or len(value) != group_size:
        return f"`member_turns` must hold rollout.group_size = {group_size} members"
    for m, member in enumerate(value):
        where = f"`member_turns[{m}]`"
        turns = member
        if isinstance(member, dict):
            unknown = sorted(set(member) - _MEMBER_KEYS)
            if unknown:
                return f"{where}: unknown key {unknown[0]!r} (turns, harness_error, reward)"
            turns = member.get("turns")
            if not isinstance(member.get("harness_error", False), bool):
                return f"{where}: `harness_error` must be true or false"
            reward = member.get("reward")
            if reward is not None and not (_is_number(reward) and math.isfinite(reward)):
                return f"{where}: `reward` must be a finite number"
        if not isinstance(turns, list) or not turns:
            return f"{where} must be a non-empty list of turns (or an object with `turns`)"
        if len(turns) > max_turns:
            return f"{where} has {len(turns)} turns, over limits.max_turns = {max_turns}"
        for t, turn in enumerate(turns):
            if not isinstance(turn, dict):
                return f"{where} turn {t}: a turn must be an object"
            unknown = sorted(set(turn) - _TURN_KEYS)
            if unknown:
                return f"{where} turn {t}: unknown key {unknown[0]!r} (gen, tool_s, tool_tokens)"
            if not (_is_int(turn.get("gen")) and turn["gen"] >= 0):
                return f"{where} turn {t}: `gen` must be an int >= 0"
            tool_s = turn.get("tool_s", 0)
            if not (_is_number(tool_s) and math.isfinite(tool_s) and tool_s >= 0):
                return f"{where} turn {t}: `tool_s` must be a finite number of seconds >= 0"
            if not (_is_int(turn.get("tool_tokens", 0)) and turn.get("tool_tokens", 0) >= 0):
                return f"{where} turn {t}: `tool_tokens` must be an int >= 0"
    return None


def check_prompt(obj: Any, *, group_size: int, max_bytes: int, where: str,
                 max_turns: int = MAX_TURNS) -> tuple[str, bytes]:
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
            _is_int(t) and t >= 0 for t in obj["input_ids"])):
        raise BadInput(
            f"{where}: prompt {pid!r}: `input_ids` must be a non-empty list of ints >= 0")
    if "member_lengths" in obj:
        lengths = obj["member_lengths"]
        if not isinstance(lengths, list) or len(lengths) != group_size:
            raise BadInput(f"{where}: prompt {pid!r}: `member_lengths` must hold "
                           f"rollout.group_size = {group_size} ints")
        if not all(_is_int(n) and n > 0 for n in lengths):
            raise BadInput(f"{where}: prompt {pid!r}: `member_lengths` entries must be ints > 0")
    if "member_turns" in obj:
        problem = check_member_turns(obj["member_turns"], group_size=group_size,
                                     max_turns=max_turns)
        if problem is not None:
            raise BadInput(f"{where}: prompt {pid!r}: {problem}")
    if "p_correct" in obj and not (isinstance(obj["p_correct"], (int, float))
                                   and not isinstance(obj["p_correct"], bool)
                                   and 0 <= obj["p_correct"] <= 1):
        raise BadInput(f"{where}: prompt {pid!r}: `p_correct` must be a number in [0, 1]")
    raw = _canonical(obj, pid, where)
    if len(raw) > max_bytes:
        raise BadInput(f"{where}: prompt {pid!r} is {len(raw)} bytes, over "
                       f"limits.max_prompt_bytes = {max_bytes}")
    return pid, raw


def _is_blank(line: str) -> bool:
    return not line.strip(" \t\r\n")  # JSON's whitespace only


def parse_numbered(lines: Iterable[str], *, group_size: int, max_bytes: int,
                   source: str = "prompts", max_turns: int = MAX_TURNS
                   ) -> list[tuple[int, str, bytes]]:
    """Parse JSON Lines into (line number, id, prompt JSON); blank lines are skipped;
    duplicate ids are refused. Every refusal starts ``source:LINE:``."""
    out: list[tuple[int, str, bytes]] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if _is_blank(line):
            continue
        where = f"{source}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        except ValueError:  # an int over sys.get_int_max_str_digits() digits
            raise BadInput(f"{where}: not valid JSON: a number has too many digits") from None
        except RecursionError:
            raise BadInput(f"{where}: not valid JSON: nested too deeply") from None
        pid, raw = check_prompt(obj, group_size=group_size, max_bytes=max_bytes, where=where,
                                max_turns=max_turns)
        if pid in seen:
            raise BadInput(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})")
        seen[pid] = number
        out.append((number, pid, raw))
    return out


def parse_lines(lines: Iterable[str], *, group_size: int, max_bytes: int,
                source: str = "prompts") -> list[tuple[str, bytes]]:
    """Parse JSON Lines into (id, prompt JSON); see :func:`parse_numbered`."""
    return [(pid, raw) for _, pid, raw in parse_numbered(
        lines, group_size=group_size, max_bytes=max_bytes, source=source)]


def split_lines(text: str) -> Iterator[str]:
    """JSON Lines' lines: split on ``\\n`` only, a trailing ``\\r`` dropped."""
    for line in text.split("\n"):
        yield line[:-1] if line.endswith("\r") else line


def read_numbered(path: str | Path, *, group_size: int, max_bytes: int,
                  max_turns: int = MAX_TURNS) -> list[tuple[int, str, bytes]]:
    """Read and validate a prompt file: (line number, id, prompt JSON), all or none."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"{p}: cannot read: {exc.strerror or exc}") from None
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise BadInput(f"{p}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} "
                       f"at byte {column} of the line)") from None
    return parse_numbered(split_lines(text), group_size=group_size, max_bytes=max_bytes,
                          source=str(p), max_turns=max_turns)


def read_file(path: str | Path, *, group_size: int, max_bytes: int) -> list[tuple[str, bytes]]:
    """Read and validate a prompt file: (id, prompt JSON), all or none."""
    return [(pid, raw) for _, pid, raw in read_numbered(
        path, group_size=group_size, max_bytes=max_bytes)]


def known_ids_refusal(ids: Sequence[str], places: Mapping[str, str]) -> str:
    """The message for a submission the farm refused because it already knows *ids*;
    *places* says where each submitted id came from (``line 3``, ``prompt #2``)."""
    shown = ", ".join(f"{pid!r} ({places[pid]})" if pid in places else repr(pid)
                      for pid in ids[:SHOWN_IDS])
    more = f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
    return (f"nothing submitted: {len(ids)} id{'s' if len(ids) != 1 else ''} already "
            f"known to the farm: {shown}{more}")
