"""Prompts: JSON Lines, one object per line.

Each object has ``id`` (a non-empty string, unique) and ``prompt`` (a string) or
``input_ids`` (a list of ints); any other field is kept for the workflow. What else a
prompt must carry is the farm's workflow's to say (``member_lengths`` for
``controlled_length``, ``answer`` for ``math``, ...: see
:func:`queue_rollout.workers.workflows.prompt_needs`), and on simulated replicas
``p_correct``, if given, is a number in [0, 1]. A bad line is refused with its line
number, and nothing is submitted; so is a file without a prompt.

Lines are separated by ``\\n`` (a ``\\r`` before it is dropped), as in JSON Lines:
U+2028 and other characters ``str.splitlines`` would split on may appear inside a
JSON string. A UTF-8 byte order mark at the start of a file is ignored.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from queue_rollout.config import Config
from queue_rollout.engines.synthetic import hint_problem
from queue_rollout.errors import BadInput

#: At most this many known ids are named when the farm refuses a submission.
SHOWN_IDS = 10

#: What the farm needs of a prompt beyond the basics: what is wrong with it, or None.
Needs = Callable[[dict[str, Any]], str | None]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def farm_needs(config: Config) -> Needs:
    """What *config*'s farm needs of a prompt beyond the basics: what its workflow
    declares (``prompt_fields``, ``check_prompt``), and on simulated replicas a
    ``p_correct`` in [0, 1] (they read it). Resolved once; ConfigError when the
    workflow's declaration is malformed."""
    from queue_rollout.workers.workflows import prompt_needs  # light: no Redis, no engine

    workflow = prompt_needs(config)
    sim = config.engine.kind == "sim"

    def problem(prompt: dict[str, Any]) -> str | None:
        return (sim and hint_problem(prompt)) or workflow.problem(prompt)

    return problem


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


def check_prompt(obj: Any, *, max_bytes: int, where: str,
                 needs: Needs | None = None) -> tuple[str, bytes]:
    """Validate one prompt object; returns (id, canonical JSON bytes). *needs*: what
    the farm needs beyond the basics (:func:`farm_needs`), checked last."""
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
    raw = _canonical(obj, pid, where)
    if len(raw) > max_bytes:
        raise BadInput(f"{where}: prompt {pid!r} is {len(raw)} bytes, over "
                       f"limits.max_prompt_bytes = {max_bytes}")
    problem = needs(obj) if needs is not None else None
    if problem is not None:
        raise BadInput(f"{where}: prompt {pid!r}: {problem}")
    return pid, raw


def _is_blank(line: str) -> bool:
    return not line.strip(" \t\r\n")  # JSON's whitespace only


def parse_numbered(lines: Iterable[str], *, max_bytes: int, needs: Needs | None = None,
                   source: str = "prompts") -> list[tuple[int, str, bytes]]:
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
        pid, raw = check_prompt(obj, max_bytes=max_bytes, where=where, needs=needs)
        if pid in seen:
            raise BadInput(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})")
        seen[pid] = number
        out.append((number, pid, raw))
    return out


def parse_lines(lines: Iterable[str], *, max_bytes: int, needs: Needs | None = None,
                source: str = "prompts") -> list[tuple[str, bytes]]:
    """Parse JSON Lines into (id, prompt JSON); see :func:`parse_numbered`."""
    return [(pid, raw) for _, pid, raw in parse_numbered(
        lines, max_bytes=max_bytes, needs=needs, source=source)]


def split_lines(text: str) -> Iterator[str]:
    """JSON Lines' lines: split on ``\\n`` only, a trailing ``\\r`` dropped."""
    for line in text.split("\n"):
        yield line[:-1] if line.endswith("\r") else line


def read_numbered(path: str | Path, *, max_bytes: int, needs: Needs | None = None
                  ) -> list[tuple[int, str, bytes]]:
    """Read and validate a prompt file: (line number, id, prompt JSON), all or none. A
    file without a prompt (empty, or blank lines only) is refused."""
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
    prompts = parse_numbered(split_lines(text), max_bytes=max_bytes, needs=needs,
                             source=str(p))
    if not prompts:
        raise BadInput(f"{p}: the file holds no prompts (JSON Lines: one object per line); "
                       "nothing submitted")
    return prompts


def read_file(path: str | Path, *, max_bytes: int, needs: Needs | None = None
              ) -> list[tuple[str, bytes]]:
    """Read and validate a prompt file: (id, prompt JSON), all or none."""
    return [(pid, raw) for _, pid, raw in read_numbered(path, max_bytes=max_bytes,
                                                        needs=needs)]


def known_ids_refusal(ids: Sequence[str], places: Mapping[str, str]) -> str:
    """The message for a submission the farm refused because it already knows *ids*;
    *places* says where each submitted id came from (``line 3``, ``prompt #2``)."""
    shown = ", ".join(f"{pid!r} ({places[pid]})" if pid in places else repr(pid)
                      for pid in ids[:SHOWN_IDS])
    more = f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
    return (f"nothing submitted: {len(ids)} id{'s' if len(ids) != 1 else ''} already "
            f"known to the farm: {shown}{more}")
