"""Workload files: checked line by line, whole groups sampled by seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queue_rollout.lab.plan.workload import WorkloadError, read_shapes, sample_manifest
from queue_rollout.lab.virtual.shape import Scale

GROUPS = [
    {"prompt_tokens": 100, "members": [{"output_tokens": n} for n in (10, 20, 30, 40)]},
    {"members": [{"output_tokens": n} for n in (5, 5, 5, 500)]},
    {"prompt_tokens": 7, "members": [{"output_tokens": n} for n in (1, 2, 3, 4)]},
]


def write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n"
                            for x in lines))
    return path


def test_whole_groups_are_sampled_by_seed(tmp_path: Path) -> None:
    shapes = read_shapes(write(tmp_path / "w.jsonl", [*GROUPS, ""]))
    assert len(shapes) == 3
    one = sample_manifest(shapes, 30, seed=1, scale=Scale(1, 1))
    assert one == sample_manifest(shapes, 30, seed=1, scale=Scale(1, 1))
    assert one != sample_manifest(shapes, 30, seed=2, scale=Scale(1, 1))
    wanted = {tuple(m["output_tokens"] for m in g["members"]): g.get("prompt_tokens", 1)
              for g in GROUPS}
    for prompt in one:  # each a whole group of the file: its members and its prompt
        assert wanted[tuple(prompt["member_lengths"])] == prompt["prompt_tokens"]
    assert len({p["id"] for p in one}) == 30


def test_multi_turn_members_and_scale(tmp_path: Path) -> None:
    shape = {"prompt_tokens": 800, "members": [
        {"turns": [{"gen": 80, "tool_s": 4.0, "tool_tokens": 160}, {"gen": 40}]},
        {"output_tokens": 200}]}
    shapes = read_shapes(write(tmp_path / "w.jsonl", [shape]))
    [prompt] = sample_manifest(shapes, 1, seed=0, scale=Scale(time=0.5, tokens=0.25))
    assert prompt["prompt_tokens"] == 200
    assert prompt["member_turns"] == [
        [{"gen": 20, "tool_s": 2.0, "tool_tokens": 40}, {"gen": 10, "tool_s": 0.0,
                                                          "tool_tokens": 0}],
        [{"gen": 50, "tool_s": 0.0, "tool_tokens": 0}]]


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", "line 2: not JSON"),
    ('{"members": []}', "line 2: members must be a non-empty list"),
    ('{"members": [{"output_tokens": 0}]}', "line 2: member 0 output_tokens must be"),
    ('{"members": [{"output_tokens": 3, "turns": []}]}', "line 2: member 0: give exactly"),
    ('{"members": [{"turns": [{"gen": 3, "tool_s": -1}]}]}', "line 2: member 0 turn 0: tool_s"),
    ('{"prompt_tokens": 5, "members": [{"output_tokens": 3}], "x": 1}', "unknown field"),
    ('[1, 2]', "line 2: a group shape is a JSON object"),
    ('{"members": [{"output_tokens": 3}]}', "groups of different sizes [1, 4]"),
])
def test_a_bad_line_is_named(tmp_path: Path, line: str, says: str) -> None:
    path = write(tmp_path / "w.jsonl", [GROUPS[0], line])
    with pytest.raises(WorkloadError, match=says.replace("[", r"\[").replace("]", r"\]")):
        read_shapes(path)


def test_an_empty_or_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no group shapes"):
        read_shapes(write(tmp_path / "empty.jsonl", ["", "  "]))
    with pytest.raises(WorkloadError, match=r"missing\.jsonl"):
        read_shapes(tmp_path / "missing.jsonl")
    assert WorkloadError("x").exit_code == 2
