"""`submit` checks prompts against what the farm's workflow needs of them (the built-ins'
and a plugin's declaration), and refuses a file without a prompt: exit 2, the line
named, nothing enqueued."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from queue_rollout.cli.main import main
from queue_rollout.config import load_config
from queue_rollout.errors import ConfigError
from testkit import write_farm

PLUGIN = textwrap.dedent('''
    class Episode:
        def run(self, ctx):
            return None


    def make(config):
        return Episode()


    def _rubric(prompt, config):
        if not isinstance(prompt["rubric"], str) or not prompt["rubric"]:
            return "`rubric` must be a non-empty string"
        return None


    make.prompt_fields = ["rubric"]
    make.check_prompt = _rubric


    def plain(config):
        return Episode()


    class Graded:
        prompt_fields = ("rubric", "answer")

        def __init__(self, config):
            self.config = config

        @staticmethod
        def check_prompt(prompt, config):
            if prompt["rubric"] == "boom":
                raise KeyError("grader")
            return prompt["rubric"] != "no"

        def run(self, ctx):
            return None


    def broken(config):
        return Episode()


    broken.prompt_fields = "rubric"
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> str:
    """A workflow plugin module on sys.path; its name."""
    name = f"flows_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def farm(tmp_path: Path, redis_url: str, workflow: str = "", name: str = "sub") -> Path:
    return write_farm(tmp_path / "farm.toml", farm={"name": name, "redis_url": redis_url},
                      rollout={"group_size": 2}, workflow={"name": workflow} if workflow else {})


def write(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def submit(file: Path, toml: Path, capsys) -> tuple[int, str, str]:
    code = main(["submit", str(file), "-c", str(toml)])
    out, err = capsys.readouterr()
    return code, out, err


def test_plain_prompts_on_a_controlled_length_farm_are_refused_by_line(
        tmp_path, redis_url, r, capsys):
    """The default workflow makes member m produce member_lengths[m] tokens: a prompt
    without them would fail every episode in a worker, its id used up."""
    toml = farm(tmp_path, redis_url)  # workflow.name defaults to controlled_length
    file = write(tmp_path / "p.jsonl", {"id": "a", "prompt": "x", "member_lengths": [1, 2]},
                 {"id": "b", "prompt": "x"}, {"id": "c", "prompt": "x"})
    assert submit(file, toml, capsys) == (
        2, "", f"queue-rollout: {file}:2: prompt 'b': `member_lengths` missing: workflow "
               "'controlled_length' needs it in every prompt\n")
    assert r.keys("*") == []  # nothing enqueued, nothing recorded
    write(file, {"id": "a", "prompt": "x", "member_lengths": [1, 2]},
          {"id": "b", "prompt": "x", "member_lengths": [3, 4]})
    assert submit(file, toml, capsys) == (0, "submitted 2 prompts to farm sub\n", "")
    assert r.lrange("qr:{sub}:pending", 0, -1) == [b"a", b"b"]


def test_math_prompts_without_an_answer_are_refused(tmp_path, redis_url, r, capsys):
    """math scores a prompt without `answer` 0 whatever the model says."""
    toml = farm(tmp_path, redis_url, "math")
    file = write(tmp_path / "p.jsonl", {"id": "a", "prompt": "2+2?", "answer": "4"},
                 {"id": "b", "prompt": "3+3?", "member_lengths": [1, 2]})
    code, _, err = submit(file, toml, capsys)
    assert (code, err) == (2, f"queue-rollout: {file}:2: prompt 'b': `answer` missing: "
                              "workflow 'math' needs it in every prompt\n")
    assert r.keys("*") == []
    write(file, {"id": "a", "prompt": "2+2?", "answer": "4"}, {"id": "b", "prompt": "3+3?",
                                                               "answer": 6})
    assert submit(file, toml, capsys)[0] == 0
    assert r.lrange("qr:{sub}:pending", 0, -1) == [b"a", b"b"]


def test_noop_needs_nothing_beyond_the_basics(tmp_path, redis_url, r, capsys):
    toml = farm(tmp_path, redis_url, "noop")
    file = write(tmp_path / "p.jsonl", {"id": "a", "prompt": "x"}, {"id": "b", "input_ids": [1]})
    assert submit(file, toml, capsys)[0] == 0
    assert r.llen("qr:{sub}:pending") == 2


@pytest.mark.parametrize("rows,line,message", [
    ([{"id": "a", "prompt": "x", "rubric": "r"}, {"id": "b", "prompt": "x"}], 2,
     "prompt 'b': `rubric` missing: workflow '{mod}:make' needs it in every prompt"),
    ([{"id": "a", "prompt": "x", "rubric": ""}], 1, "prompt 'a': `rubric` must be a non-empty "
                                                    "string"),
])
def test_a_plugins_declared_needs_are_enforced(tmp_path, redis_url, r, capsys, plugin, rows,
                                               line, message):
    toml = farm(tmp_path, redis_url, f"{plugin}:make")
    file = write(tmp_path / "p.jsonl", *rows)
    code, _, err = submit(file, toml, capsys)
    assert (code, err) == (2, f"queue-rollout: {file}:{line}: {message.format(mod=plugin)}\n")
    assert r.keys("*") == []
    write(file, {"id": "a", "prompt": "x", "rubric": "r"})
    assert submit(file, toml, capsys)[0] == 0


def test_a_plugin_class_declares_on_itself_and_its_check_may_answer_false_or_raise(
        tmp_path, redis_url, r, capsys, plugin):
    toml = farm(tmp_path, redis_url, f"{plugin}:Graded")
    file = write(tmp_path / "p.jsonl", {"id": "a", "prompt": "x", "rubric": "r"})
    code, _, err = submit(file, toml, capsys)
    assert (code, err) == (2, f"queue-rollout: {file}:1: prompt 'a': `answer` missing: "
                              f"workflow '{plugin}:Graded' needs it in every prompt\n")
    write(file, {"id": "a", "prompt": "x", "rubric": "no", "answer": 1})
    assert submit(file, toml, capsys)[2] == (
        f"queue-rollout: {file}:1: prompt 'a': refused by workflow '{plugin}:Graded''s "
        "check_prompt\n")
    write(file, {"id": "a", "prompt": "x", "rubric": "boom", "answer": 1})
    assert submit(file, toml, capsys)[2] == (
        f"queue-rollout: {file}:1: prompt 'a': workflow '{plugin}:Graded': check_prompt "
        "raised KeyError: 'grader'\n")
    assert r.keys("*") == []
    write(file, {"id": "a", "prompt": "x", "rubric": "fine", "answer": 1})
    assert submit(file, toml, capsys)[0] == 0


def test_a_plugin_that_declares_nothing_takes_any_well_formed_prompt(
        tmp_path, redis_url, r, capsys, plugin):
    toml = farm(tmp_path, redis_url, f"{plugin}:plain")
    file = write(tmp_path / "p.jsonl", {"id": "a", "prompt": "x"})
    assert submit(file, toml, capsys)[0] == 0
    assert r.lrange("qr:{sub}:pending", 0, -1) == [b"a"]


def test_a_malformed_declaration_is_a_config_error_for_submit_and_the_worker(
        tmp_path, redis_url, r, capsys, plugin):
    from queue_rollout.workers.workflows import load_workflow

    toml = farm(tmp_path, redis_url, f"{plugin}:broken")
    file = write(tmp_path / "p.jsonl", {"id": "a", "prompt": "x", "rubric": "r"})
    code, _, err = submit(file, toml, capsys)
    assert code == 2 and err.startswith(
        f"queue-rollout: workflow.name: '{plugin}:broken': prompt_fields must be a list of "
        "field names, got 'rubric'"), err
    assert r.keys("*") == []
    with pytest.raises(ConfigError, match="prompt_fields must be a list of field names"):
        load_workflow(load_config(toml))


@pytest.mark.parametrize("content", [b"", b"\n", b"  \r\n\t\n", b"\xef\xbb\xbf\n"])
def test_a_file_without_a_prompt_is_refused(tmp_path, redis_url, r, capsys, content):
    toml = farm(tmp_path, redis_url, "noop")
    file = tmp_path / "empty.jsonl"
    file.write_bytes(content)
    assert submit(file, toml, capsys) == (
        2, "", f"queue-rollout: {file}: the file holds no prompts (JSON Lines: one object "
               "per line); nothing submitted\n")
    assert r.keys("*") == []
