"""Prompt files: every bad line named by its number; nothing submitted on an error."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from queue_rollout.cli.main import main
from queue_rollout.client.prompts import parse_lines, parse_numbered, split_lines
from queue_rollout.errors import BadInput
from testkit import examples


def parse(*lines: str, G: int = 2, max_bytes: int = 1000):
    return parse_lines(lines, group_size=G, max_bytes=max_bytes)


def test_good_lines_keep_extra_fields():
    [(pid, raw)] = parse('{"id": "a", "prompt": "hi", "answer": "4", "topic": "math"}')
    assert pid == "a" and json.loads(raw)["topic"] == "math"
    assert parse('{"id": "b", "input_ids": [1, 2]}', "", '{"id": "c", "prompt": "x"}')[1][0] == "c"


@pytest.mark.parametrize("line,message", [
    ("{not json", "prompts:1: not valid JSON"),
    ('["a"]', "a prompt must be a JSON object"),
    ('{"prompt": "x"}', "`id` must be a non-empty string"),
    ('{"id": "", "prompt": "x"}', "`id` must be a non-empty string"),
    ('{"id": "a"}', "exactly one of `prompt` or `input_ids`"),
    ('{"id": "a", "prompt": "x", "input_ids": [1]}', "exactly one of"),
    ('{"id": "a", "input_ids": [1, -2]}', "`input_ids` must be a non-empty list"),
    ('{"id": "a", "prompt": "x", "member_lengths": [1]}', "must hold rollout.group_size = 2"),
    ('{"id": "a", "prompt": "x", "member_lengths": [1, 0]}', "entries must be ints > 0"),
    ('{"id": "a", "prompt": "x", "member_lengths": [1, true]}', "entries must be ints > 0"),
    ('{"id": "a", "prompt": "x", "p_correct": 2}', "`p_correct` must be a number in [0, 1]"),
    ('{"id": "a", "prompt": "' + "x" * 2000 + '"}', "over limits.max_prompt_bytes = 1000"),
    ('{"id": "a", "prompt": "x", "w": NaN}', "prompt 'a' is not JSON: NaN and infinities"),
    ('{"id": "a", "prompt": "x", "w": 1e999}', "prompt 'a' is not JSON: NaN and infinities"),
    ('{"id": "a\\udfff", "prompt": "x"}', "is not JSON: a lone surrogate"),
    ('{"id": "a", "prompt": "x", "n": ' + "9" * 5000 + "}",
     "not valid JSON: a number has too many digits"),
    ("[" * 100_000, "not valid JSON: nested too deeply"),
])
def test_bad_lines_are_named(line, message):
    with pytest.raises(BadInput) as info:
        parse(line)
    assert message in str(info.value) and "prompts:1" in str(info.value)


T = '{"gen": 5, "tool_s": 0.5, "tool_tokens": 3}'


@pytest.mark.parametrize("turns,message", [
    (f"[[{T}]]", "`member_turns` must hold rollout.group_size = 2 members"),
    ("[[], [" + T + "]]", "`member_turns[0]` must be a non-empty list of turns"),
    (f"[[{T}], [5]]", "`member_turns[1]` turn 0: a turn must be an object"),
    (f'[[{T}], [{{"gen": -1}}]]', "`member_turns[1]` turn 0: `gen` must be an int >= 0"),
    (f'[[{T}], [{{"gen": 1.5}}]]', "`gen` must be an int >= 0"),
    (f'[[{T}], [{{"gen": true}}]]', "`gen` must be an int >= 0"),
    (f'[[{T}], [{{"tool_s": 1}}]]', "`gen` must be an int >= 0"),
    (f'[[{T}], [{{"gen": 1, "tool_s": NaN}}]]', "`tool_s` must be a finite number"),
    (f'[[{T}], [{{"gen": 1, "tool_s": -0.5}}]]', "`tool_s` must be a finite number"),
    (f'[[{T}], [{{"gen": 1, "tool_tokens": -1}}]]', "`tool_tokens` must be an int >= 0"),
    (f'[[{T}], [{{"gen": 1, "tools": 1}}]]', "unknown key 'tools'"),
    (f"[[{T}], [{', '.join([T] * 4)}]]", "has 4 turns, over limits.max_turns = 3"),
    (f'[[{T}], {{"turns": [{T}], "harness_error": 1}}]', "`harness_error` must be true or"),
    (f'[[{T}], {{"turns": [{T}], "reward": "x"}}]', "`reward` must be a finite number"),
    (f'[[{T}], {{"turns": [{T}], "why": 1}}]', "unknown key 'why'"),
    (f'[[{T}], {{"harness_error": true}}]', "`member_turns[1]` must be a non-empty list"),
])
def test_bad_member_turns_are_named(turns, message):
    line = '{"id": "a", "input_ids": [1, 2], "member_turns": ' + turns + "}"
    with pytest.raises(BadInput) as info:
        parse_numbered([line], group_size=2, max_bytes=10_000, max_turns=3)
    assert message in str(info.value) and "prompts:1: prompt 'a'" in str(info.value)


def test_member_turns_as_lists_or_objects_are_kept():
    line = ('{"id": "a", "input_ids": [1], "member_turns": [[' + T + ', {"gen": 0}], '
            '{"turns": [' + T + '], "harness_error": true, "reward": 1}]}')
    [(_, pid, raw)] = parse_numbered([line], group_size=2, max_bytes=10_000, max_turns=3)
    assert pid == "a" and json.loads(raw)["member_turns"][1]["harness_error"] is True


def test_duplicate_ids_in_a_file_name_both_lines():
    with pytest.raises(BadInput, match=r"prompts:3: duplicate id 'a' \(first on line 1\)"):
        parse('{"id": "a", "prompt": "x"}', '{"id": "b", "prompt": "x"}',
              '{"id": "a", "prompt": "y"}')


def test_submit_command_enqueues_all_or_nothing(tmp_path, redis_url, r, capsys):
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[farm]\nname = "s"\nredis_url = "{redis_url}"\n[rollout]\ngroup_size = 2\n')
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "c", "prompt": "x"}\n'
                   '{"id": "d", "prompt": "x", "member_lengths": [1]}\n')
    assert main(["submit", str(bad), "-c", str(toml)]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
    turns = [[{"gen": 1}]] * 2
    long = tmp_path / "long.jsonl"  # one turn over limits.max_turns (2 in this farm)
    long.write_text(json.dumps({"id": "e", "prompt": "x", "member_turns": turns}) + "\n"
                    + json.dumps({"id": "f", "prompt": "x",
                                  "member_turns": [[{"gen": 1}] * 3] * 2}) + "\n")
    toml.write_text(toml.read_text() + "[limits]\nmax_turns = 2\n")
    assert main(["submit", str(long), "-c", str(toml)]) == 2
    assert f"{long}:2: prompt 'f': `member_turns[0]` has 3 turns, over limits.max_turns = 2" \
        in capsys.readouterr().err
    assert main(["submit", str(good), "-c", str(toml)]) == 0
    assert "submitted 2 prompts" in capsys.readouterr().out
    again = tmp_path / "again.jsonl"
    again.write_text('{"id": "z", "prompt": "x"}\n{"id": "a", "prompt": "x"}\n')
    assert main(["submit", str(again), "-c", str(toml)]) == 2
    assert (f"{again}: nothing submitted: 1 id already known to the farm: 'a' (line 2)"
            in capsys.readouterr().err)
    assert r.lrange("qr:{s}:pending", 0, -1) == [b"a", b"b"]


# -- fuzzing the parser: valid (id, JSON) pairs or BadInput at the right line, nothing else

FUZZ = settings(max_examples=examples(200), derandomize=True)
ODD = "\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e\r\ud800\udfff\ufeff\"\\"
# st.text() leaves out lone surrogates, even when its alphabet names them
text = st.lists(st.characters() | st.sampled_from(ODD), max_size=12).map("".join)
scalars = (st.none() | st.booleans() | st.integers(-3, 6) | st.integers() | st.floats()
           | st.sampled_from([float("nan"), float("inf")]) | text)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(text, inner, max_size=3), max_leaves=8)
ids = st.sampled_from(["a", "b", "c"]) | text.filter(bool)
turn = st.fixed_dictionaries({"gen": st.integers(0, 9)}, optional={
    "tool_s": st.floats(0, 5), "tool_tokens": st.integers(0, 9)})
optional = {"answer": values, "extra": values, "p_correct": st.floats(0, 1),
            "member_lengths": st.lists(st.integers(1, 3), min_size=2, max_size=2),
            "member_turns": st.lists(st.lists(turn, min_size=1, max_size=3), min_size=2,
                                     max_size=2)}
good_objects = (st.fixed_dictionaries({"id": ids, "prompt": text}, optional=optional)
                | st.fixed_dictionaries({"id": ids, "input_ids": st.lists(
                    st.integers(0, 9), min_size=1, max_size=3)}, optional=optional))
FIELDS = ["id", "prompt", "input_ids", "member_lengths", "member_turns", "p_correct",
          "answer"]
mutated = st.tuples(good_objects, st.sampled_from(FIELDS), values | st.just(None)).map(
    lambda v: {**v[0], v[1]: v[2]} if v[2] is not None else
    {k: x for k, x in v[0].items() if k != v[1]})


def as_line(objects: st.SearchStrategy) -> st.SearchStrategy[str]:
    return st.tuples(objects, st.booleans()).map(lambda v: json.dumps(v[0], ensure_ascii=v[1]))


json_lines = st.one_of(*[as_line(good_objects)] * 4, as_line(mutated), as_line(values))
broken = st.tuples(json_lines, st.integers(0, 40), text).map(
    lambda v: v[0][: v[1]] + v[2] + v[0][v[1]:])
junk = broken | text | st.sampled_from(["", " \t", "{", "\ufeff{}"])
lines = st.lists(st.one_of(*[json_lines] * 3, junk), max_size=6)


def blank(line: str) -> bool:
    return not line.strip(" \t\r\n")


def parse_f(lines: list[str]) -> list[tuple[int, str, bytes]]:
    return parse_numbered(lines, group_size=2, max_bytes=300, source="f")


@FUZZ
@given(lines)
@example(['{"id": "a", "prompt": "x"}', "", '{"id": "a", "prompt": "y"}'])
@example(['{"id": "a", "prompt": "x", "n": ' + "1" * 4301 + "}"])
@example([" ", "[" * 5000])
@example(['{"id": "\\ud800", "prompt": "x"}', '{"id": "b", "prompt": "x", "w": -Infinity}'])
def test_parser_fuzz_accepts_round_trips_or_names_the_first_bad_line(lines):
    try:
        out = parse_f(lines)
    except BadInput as exc:
        m = re.match(r"f:(\d+): ", str(exc))
        assert m, str(exc)
        n = int(m.group(1))
        assert 1 <= n <= len(lines) and not blank(lines[n - 1])
        parse_f(lines[: n - 1])  # every line before it is fine
        with pytest.raises(BadInput, match=rf"^f:{n}: "):
            parse_f(lines[:n])
        return
    kept = [(n, line) for n, line in enumerate(lines, start=1) if not blank(line)]
    assert [n for n, _, _ in out] == [n for n, _ in kept]
    assert len({pid for _, pid, _ in out}) == len(out)
    for (_, pid, raw), (_, line) in zip(out, kept, strict=True):
        obj = json.loads(line)
        assert json.loads(raw) == obj and pid == obj["id"] and len(raw) <= 300
        assert ("prompt" in obj) != ("input_ids" in obj)


@FUZZ
@given(json_lines)
def test_parser_fuzz_one_line(line):
    """Every line alone: a prompt whose stored JSON decodes back to it, or BadInput."""
    try:
        [(number, pid, raw)] = parse_f([line])
    except BadInput as exc:
        assert str(exc).startswith("f:1: ")
        return
    obj = json.loads(line)
    assert number == 1 and pid == obj["id"] and json.loads(raw) == obj
    assert raw.decode() == json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


BREAKS = "\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e\r\ufeff"
clean_text = st.text(st.characters(exclude_categories=["Cs"]) | st.sampled_from(BREAKS),
                     max_size=12)
clean_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | clean_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(clean_text, inner, max_size=3),
    max_leaves=8)


@FUZZ
@given(st.lists(st.tuples(clean_text.filter(bool), clean_values), unique_by=lambda t: t[0],
                max_size=5), st.sampled_from(["\n", "\r\n"]))
@example([("a", "x\u2028y"), ("b", "\x85"), ("c", "\x1c\x0c")], "\n")
def test_text_fuzz_one_object_per_newline(items, newline):
    """JSON Lines split on newlines only: characters str.splitlines splits on (U+2028,
    U+0085, \\x1c, ...) may stand raw inside a JSON string."""
    objs = [{"id": pid, "prompt": "p", "extra": extra} for pid, extra in items]
    text = newline.join(json.dumps(o, ensure_ascii=False) for o in objs) + newline
    out = parse_lines(split_lines(text), group_size=2, max_bytes=10_000)
    assert [(pid, json.loads(raw)) for pid, raw in out] == [(o["id"], o) for o in objs]
