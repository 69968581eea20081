"""Prompt files: every bad line named by its number; nothing submitted on an error."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from queue_rollout.cli.main import main
from queue_rollout.client.prompts import farm_needs, parse_lines, parse_numbered, split_lines
from queue_rollout.errors import BadInput
from testkit import examples, farm_config, write_farm


def needs(workflow: str = "controlled_length", *, G: int = 2, kind: str = "sim",
          max_turns: int = 256):
    """What a farm of *workflow* on *kind* replicas needs of a prompt."""
    return farm_needs(farm_config(rollout={"group_size": G}, workflow={"name": workflow},
                                  engine={"kind": kind}, limits={"max_turns": max_turns}))


def parse(*lines: str, max_bytes: int = 1000, workflow: str = "noop"):
    return parse_lines(lines, max_bytes=max_bytes, needs=needs(workflow))


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
    (f'[[{T}], [{{"gen": 1, "tool_s": "1"}}]]', "`tool_s` must be a finite number"),
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
        parse_numbered([line], max_bytes=10_000,
                       needs=needs("controlled_turns", max_turns=3))
    assert message in str(info.value) and "prompts:1: prompt 'a'" in str(info.value)


def test_member_turns_as_lists_or_objects_are_kept():
    line = ('{"id": "a", "input_ids": [1], "member_turns": [[' + T + ', {"gen": 0}], '
            '{"turns": [' + T + '], "harness_error": true, "reward": 1}]}')
    [(_, pid, raw)] = parse_numbered([line], max_bytes=10_000,
                                     needs=needs("controlled_turns", max_turns=3))
    assert pid == "a" and json.loads(raw)["member_turns"][1]["harness_error"] is True


# -- what the farm's workflow needs of a prompt: checked at submit, not in a worker

@pytest.mark.parametrize("workflow,line,message", [
    ("controlled_length", '{"id": "a", "prompt": "x"}',
     "prompt 'a': `member_lengths` missing: workflow 'controlled_length' needs it in every "
     "prompt"),
    ("controlled_length", '{"id": "a", "prompt": "x", "member_lengths": [1]}',
     "prompt 'a': `member_lengths` must hold rollout.group_size = 2 ints"),
    ("controlled_length", '{"id": "a", "prompt": "x", "member_lengths": "3"}',
     "prompt 'a': `member_lengths` must hold rollout.group_size = 2 ints"),
    ("controlled_length", '{"id": "a", "prompt": "x", "member_lengths": [1, 0]}',
     "`member_lengths` entries must be ints > 0"),
    ("controlled_length", '{"id": "a", "prompt": "x", "member_lengths": [1, true]}',
     "`member_lengths` entries must be ints > 0"),
    ("controlled_length", '{"id": "a", "prompt": "x", "member_lengths": [1, 1.5]}',
     "`member_lengths` entries must be ints > 0"),
    ("controlled_length", '{"id": "a", "prompt": "x", "member_turns": [[{"gen": 1}]] }',
     "`member_lengths` missing: workflow 'controlled_length' needs it"),
    ("controlled_turns", '{"id": "a", "prompt": "x", "member_lengths": [1, 1]}',
     "`member_turns` missing: workflow 'controlled_turns' needs it in every prompt"),
    ("math", '{"id": "a", "prompt": "2+2?"}',
     "prompt 'a': `answer` missing: workflow 'math' needs it in every prompt"),
    ("math", '{"id": "a", "prompt": "2+2?", "answer": null}',
     "prompt 'a': `answer` must be a string or a number"),
    ("math", '{"id": "a", "prompt": "2+2?", "answer": [4]}',
     "prompt 'a': `answer` must be a string or a number"),
    ("math", '{"id": "a", "prompt": "2+2?", "answer": "4", "p_correct": -0.1}',
     "prompt 'a': `p_correct` must be a number in [0, 1]"),
])
def test_a_prompt_lacking_what_the_workflow_needs_is_refused_by_line(workflow, line, message):
    good = '{"id": "g", "prompt": "x", "member_lengths": [1, 2], "answer": "4", ' \
           '"member_turns": [[{"gen": 1}], [{"gen": 2}]]}'
    parse(good, workflow=workflow)  # the same farm takes a prompt that has it
    with pytest.raises(BadInput) as info:
        parse(good, line, workflow=workflow)
    assert str(info.value).startswith("prompts:2: ") and message in str(info.value)


@pytest.mark.parametrize("workflow,line", [
    ("noop", '{"id": "a", "prompt": "x"}'),
    ("noop", '{"id": "a", "prompt": "x", "member_lengths": "anything: unused here"}'),
    ("math", '{"id": "a", "prompt": "x", "answer": 4}'),
    ("math", '{"id": "a", "prompt": "x", "answer": "\\frac{1}{2}", "member_lengths": 0}'),
    ("controlled_length", '{"id": "a", "input_ids": [1], "member_lengths": [3, 5], "x": 1}'),
    ("controlled_turns", '{"id": "a", "prompt": "x", "member_turns": [[{"gen": 1}], '
                         '{"turns": [{"gen": 0}], "harness_error": true}]}'),
])
def test_fields_other_workflows_use_are_kept_unchecked(workflow, line):
    [(pid, raw)] = parse(line, workflow=workflow)
    assert pid == "a" and json.loads(raw) == json.loads(line)


@pytest.mark.parametrize("workflow,prompts,message", [
    ("controlled_length",
     [{"id": "a", "prompt": "x", "member_lengths": [1, 2]}, {"id": "b", "prompt": "x"}],
     "prompt #1: prompt 'b': `member_lengths` missing: workflow 'controlled_length' needs it "
     "in every prompt"),
    ("math", [{"id": "a", "prompt": "2+2?", "answer": "4"}, {"id": "b", "prompt": "x"},
              {"id": "c", "prompt": "x", "answer": "1"}],
     "prompt #1: prompt 'b': `answer` missing: workflow 'math' needs it in every prompt"),
    ("controlled_turns", [{"id": "a", "input_ids": [1], "member_turns": [[{"gen": 1}]]}],
     "prompt #0: prompt 'a': `member_turns` must hold rollout.group_size = 2 members"),
])
def test_the_client_refuses_what_the_workflow_lacks_naming_index_and_id(
        tmp_path, redis_url, redis_snapshot, workflow, prompts, message):
    from queue_rollout import RolloutClient

    toml = write_farm(tmp_path / "farm.toml", farm={"name": "cl", "redis_url": redis_url},
                      rollout={"group_size": 2}, workflow={"name": workflow})
    client = RolloutClient.from_config(toml)
    before = redis_snapshot()
    with pytest.raises(BadInput) as info:
        client.submit(prompts)
    assert str(info.value) == message
    assert redis_snapshot() == before and client.status()["groups"]["pending"] == 0


def test_the_client_enforces_a_plugins_declaration(tmp_path, redis_url, redis_snapshot,
                                                   monkeypatch):
    import sys

    from queue_rollout import RolloutClient

    module = f"graded_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        "class Graded:\n"
        "    prompt_fields = ['rubric']\n"
        "    def __init__(self, config):\n"
        "        pass\n"
        "    def run(self, ctx):\n"
        "        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        toml = write_farm(tmp_path / "farm.toml", farm={"name": "pl", "redis_url": redis_url},
                          workflow={"name": f"{module}:Graded"})
        client = RolloutClient.from_config(toml)
        before = redis_snapshot()
        with pytest.raises(BadInput, match=rf"^prompt #0: prompt 'q': `rubric` missing: "
                                           rf"workflow '{module}:Graded' needs it"):
            client.submit([{"id": "q", "prompt": "x"}])
        assert redis_snapshot() == before
        assert client.submit([{"id": "q", "prompt": "x", "rubric": "r"}]) == 1
    finally:
        sys.modules.pop(module, None)


def test_p_correct_is_checked_where_simulated_replicas_read_it():
    line = '{"id": "a", "prompt": "x", "answer": "4", "p_correct": 70}'
    with pytest.raises(BadInput, match=r"`p_correct` must be a number in \[0, 1\]"):
        parse_lines([line], max_bytes=1000, needs=needs("math", kind="sim"))
    [(pid, _)] = parse_lines([line], max_bytes=1000, needs=needs("math", kind="sglang"))
    assert pid == "a"  # a real SGLang never reads it: the user's own field


def test_duplicate_ids_in_a_file_name_both_lines():
    with pytest.raises(BadInput, match=r"prompts:3: duplicate id 'a' \(first on line 1\)"):
        parse('{"id": "a", "prompt": "x"}', '{"id": "b", "prompt": "x"}',
              '{"id": "a", "prompt": "y"}')


def test_submit_command_enqueues_all_or_nothing(tmp_path, redis_url, r, capsys):
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "s", "redis_url": redis_url},
                      rollout={"group_size": 2})
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "x", "member_lengths": [1, 2]}\n'
                    '{"id": "b", "prompt": "y", "member_lengths": [3, 4]}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "c", "prompt": "x", "member_lengths": [1, 2]}\n'
                   '{"id": "d", "prompt": "x", "member_lengths": [1]}\n')
    assert main(["submit", str(bad), "-c", str(toml)]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
    assert main(["submit", str(good), "-c", str(toml)]) == 0
    assert "submitted 2 prompts" in capsys.readouterr().out
    again = tmp_path / "again.jsonl"
    again.write_text('{"id": "z", "prompt": "x", "member_lengths": [1, 2]}\n'
                     '{"id": "a", "prompt": "x", "member_lengths": [1, 2]}\n')
    assert main(["submit", str(again), "-c", str(toml)]) == 2
    assert (f"{again}: nothing submitted: 1 id already known to the farm: 'a' (line 2)"
            in capsys.readouterr().err)
    assert r.lrange("qr:{s}:pending", 0, -1) == [b"a", b"b"]


def test_submit_command_checks_turns_against_limits_max_turns(tmp_path, redis_url, r, capsys):
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "t", "redis_url": redis_url},
                      rollout={"group_size": 2}, workflow={"name": "controlled_turns"},
                      limits={"max_turns": 2})
    turns = [[{"gen": 1}]] * 2
    long = tmp_path / "long.jsonl"  # one turn over limits.max_turns (2 in this farm)
    long.write_text(json.dumps({"id": "e", "prompt": "x", "member_turns": turns}) + "\n"
                    + json.dumps({"id": "f", "prompt": "x",
                                  "member_turns": [[{"gen": 1}] * 3] * 2}) + "\n")
    assert main(["submit", str(long), "-c", str(toml)]) == 2
    assert f"{long}:2: prompt 'f': `member_turns[0]` has 3 turns, over limits.max_turns = 2" \
        in capsys.readouterr().err
    assert r.keys("qr:{t}:*") == []
    long.write_text(json.dumps({"id": "e", "prompt": "x", "member_turns": turns}) + "\n")
    assert main(["submit", str(long), "-c", str(toml)]) == 0
    assert r.lrange("qr:{t}:pending", 0, -1) == [b"e"]


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
            "member_turns": st.lists(st.lists(turn, min_size=1, max_size=3), min_size=2,
                                     max_size=2)}
lengths = st.lists(st.integers(1, 3), min_size=2, max_size=2)  # the fuzzed farm's workflow
good_objects = (st.fixed_dictionaries({"id": ids, "prompt": text, "member_lengths": lengths},
                                      optional=optional)
                | st.fixed_dictionaries({"id": ids, "input_ids": st.lists(
                    st.integers(0, 9), min_size=1, max_size=3), "member_lengths": lengths},
                    optional=optional))
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


FUZZ_NEEDS = needs("controlled_length")  # and p_correct: a simulated replica reads it


def parse_f(lines: list[str]) -> list[tuple[int, str, bytes]]:
    return parse_numbered(lines, max_bytes=300, needs=FUZZ_NEEDS, source="f")


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
        assert FUZZ_NEEDS(obj) is None and len(obj["member_lengths"]) == 2


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
    out = parse_lines(split_lines(text), max_bytes=10_000)
    assert [(pid, json.loads(raw)) for pid, raw in out] == [(o["id"], o) for o in objs]
