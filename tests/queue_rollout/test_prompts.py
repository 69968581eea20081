"""Prompt files: every bad line named by its number; nothing submitted on an error."""

from __future__ import annotations

import json

import pytest

from queue_rollout.cli import main
from queue_rollout.errors import BadInput
from queue_rollout.prompts import parse_lines


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
])
def test_bad_lines_are_named(line, message):
    with pytest.raises(BadInput) as info:
        parse(line)
    assert message in str(info.value) and "prompts:1" in str(info.value)


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
    bad.write_text('{"id": "c", "prompt": "x"}\n{"id": "d", "prompt": "x", "member_lengths": [1]}\n')
    assert main(["submit", str(bad), "-c", str(toml)]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
    assert main(["submit", str(good), "-c", str(toml)]) == 0
    assert "submitted 2 prompts" in capsys.readouterr().out
    again = tmp_path / "again.jsonl"
    again.write_text('{"id": "z", "prompt": "x"}\n{"id": "a", "prompt": "x"}\n')
    assert main(["submit", str(again), "-c", str(toml)]) == 2
    assert "already known to the farm: a" in capsys.readouterr().err
    assert r.lrange("qr:{s}:pending", 0, -1) == [b"a", b"b"]
