"""The command line: exit codes, status, config errors; the console script itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from queue_rollout.cli.main import main
from testkit import trivial_prompts, write_farm


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "farm.toml"
    path.write_text("[rollout]\nmax_concurrent_samples = 0\n")
    assert main(["status", "-c", str(path)]) == 2
    assert "rollout.max_concurrent_samples" in capsys.readouterr().err


@pytest.mark.parametrize("engine,message", [
    ("slots_per_replica = 4\nmin_slots_per_replica = 5", "engine.min_slots_per_replica: 5 is "
     "above engine.slots_per_replica = 4"),
    ("min_slots_per_replica = 0", "engine.min_slots_per_replica: Expected `int` >= 1"),
])
def test_a_floor_above_the_slots_or_zero_exits_2_naming_the_key(tmp_path, engine, message):
    from queue_rollout.procs import cli_exe

    toml = tmp_path / "farm.toml"
    toml.write_text(f"[engine]\nadaptive_slots = true\n{engine}\n")
    for argv in (["worker", "--gpu", "0", "--engine-url", "http://127.0.0.1:1"], ["status"]):
        out = subprocess.run([cli_exe(), *argv, "-c", str(toml)], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 2, out.stderr
        assert message in out.stderr, out.stderr


@pytest.mark.parametrize("flags", [
    ["--max-total-tokens", "1000", "--chunked-prefill-size", "2000"],
    ["--max-total-tokens", "0"],
    ["--prefill-tokens-per-s", "-5"],
    ["--chunked-prefill-size", "1.5"],
])
def test_sim_engine_refuses_bad_model_sizes_with_exit_2(flags):
    from queue_rollout.procs import cli_exe

    # a check that let it through would serve until the timeout: the test fails
    done = subprocess.run([cli_exe(), "sim-engine", "--port", "0", *flags],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert flags[0] in done.stderr


def test_status_json_has_the_design_shape(tmp_path, redis_url, make_ledger, capsys):
    ledger = make_ledger(group_size=2, max_concurrent_samples=6)
    ledger.submit(trivial_prompts(3))
    aid = ledger.admit().attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)
    path = write_farm(tmp_path / "farm.toml", farm={"name": "t", "redis_url": redis_url},
                      rollout={"group_size": 2, "max_concurrent_samples": 6})
    assert main(["status", "--json", "-c", str(path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["mode"] == "sample" and (s["capacity"], s["reserved"]) == (6, 2)
    assert s["active_episodes"] == 1 and s["groups"]["pending"] == 2
    assert s["groups"]["in_flight"] == 1 and set(s["workers"]) == {"alive", "slots", "limits"}
    assert main(["status", "-c", str(path)]) == 0
    assert ("slots     2/6 reserved, 1 running (1 generating, 0 in a tool wait), 0 doubtful"
            in capsys.readouterr().out)
    # paused in place: what runs is held, not generating
    ledger.pause("in_place")
    assert main(["status", "--json", "-c", str(path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["paused"] and s["pause_mode"] == "in_place"
    assert main(["status", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "slots     2/6 reserved, 1 held (paused in place), 0 in a tool wait, 0 doubtful" in out
    assert "generating" not in out


@pytest.mark.parametrize("where", ["before", "after"])
def test_c_is_taken_before_the_command_as_after_it(tmp_path, redis_url, capsys, where):
    missing = tmp_path / "missing.toml"
    argv = ["status", "--json"]
    assert main(["-c", str(missing), *argv] if where == "before"
                else [*argv, "-c", str(missing)]) == 2
    assert "cannot read config" in capsys.readouterr().err
    path = write_farm(tmp_path / "farm.toml", farm={"name": "mine", "redis_url": redis_url})
    assert main(["-c", str(path), *argv] if where == "before"
                else [*argv, "-c", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["farm"] == "mine"


def test_a_reader_that_leaves_early_is_no_error(tmp_path, redis_url):
    from queue_rollout.procs import cli_exe

    path = write_farm(tmp_path / "farm.toml", farm={"name": "piped", "redis_url": redis_url})
    proc = subprocess.Popen([cli_exe(), "status", "-c", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head -1` gone before the first line is written
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0 and err == "", err


def test_two_different_configs_exit_2(tmp_path, capsys):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    assert main(["-c", str(a), "status", "-c", str(b)]) == 2
    assert "-c given twice" in capsys.readouterr().err


def test_status_without_a_farm_says_how_to_start_one(tmp_path, capsys):
    path = write_farm(tmp_path / "farm.toml", farm={"state_dir": tmp_path / "nothing"})
    assert main(["status", "-c", str(path)]) == 4
    assert "queue-rollout up" in capsys.readouterr().err


def test_console_script_is_installed():
    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    assert exe is not None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("queue-rollout ")


# -- bad input: a clear message, exit 2, and the farm's Redis state unchanged -----------

def _farm_toml(path: Path, redis_url: str, extra: str = "") -> Path:
    """Farm bi: G = 2, 2 slots, prompts up to 200 bytes. *extra*, TOML lines at the end of
    ``[rollout]``, makes it a bad config: this one stays text."""
    path.write_text(f'[farm]\nname = "bi"\nredis_url = "{redis_url}"\n'
                    f"[rollout]\ngroup_size = 2\nmax_concurrent_samples = 2\n"
                    f"{extra}[limits]\nmax_prompt_bytes = 200\n")
    return path


@pytest.fixture
def farm(tmp_path: Path, redis_url: str, r) -> Path:
    """A farm with history: 'a' admitted (its RQ jobs enqueued), 'b' pending."""
    from queue_rollout import RolloutClient
    from queue_rollout.collector.loop import Collector

    toml = _farm_toml(tmp_path / "farm.toml", redis_url)
    client = RolloutClient.from_config(toml)
    client.submit([{"id": "a", "prompt": "x", "member_lengths": [1, 1]},
                   {"id": "b", "prompt": "y", "member_lengths": [1, 1]}])
    Collector(client.ledger, client.config, name="c").step()
    assert r.hexists("qr:{bi}:groups", "a") and r.lrange("qr:{bi}:pending", 0, -1) == [b"b"]
    assert r.keys("rq:*")
    return toml


def submit_cli(file: Path, toml: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    assert exe is not None
    return subprocess.run([exe, "submit", str(file), "-c", str(toml)], capture_output=True,
                          text=True, timeout=60)


def good(i: int) -> str:
    """A line the farm takes: its workflow, controlled_length, needs member_lengths."""
    return json.dumps({"id": f"n{i}", "prompt": "x", "member_lengths": [1, 1]})


def with_lengths(lengths: str) -> list[str]:
    return [good(1), '{"id": "bad", "prompt": "x", "member_lengths": ' + lengths + "}"]


@pytest.mark.parametrize("lines,message", [
    ([good(1), good(2), '{"id": "n3", "prompt": }', good(4), good(5)],
     ":3: not valid JSON: Expecting value (column 24)"),
    ([good(1), good(2), '{"id": "n1", "prompt": "again", "member_lengths": [2, 2]}'],
     ":3: duplicate id 'n1' (first on line 1)"),
    (with_lengths("[1, 2, 3]"), ":2: prompt 'bad': `member_lengths` must hold "
                                "rollout.group_size = 2 ints"),
    (with_lengths("[]"), ":2: prompt 'bad': `member_lengths` must hold "
                         "rollout.group_size = 2 ints"),
    (with_lengths('"3"'), ":2: prompt 'bad': `member_lengths` must hold "
                          "rollout.group_size = 2 ints"),
    (with_lengths("[5, 0]"), ":2: prompt 'bad': `member_lengths` entries must be ints > 0"),
    (with_lengths("[5, -1]"), ":2: prompt 'bad': `member_lengths` entries must be ints > 0"),
    (with_lengths("[true, 5]"), ":2: prompt 'bad': `member_lengths` entries must be ints > 0"),
    (with_lengths("[5, 1.5]"), ":2: prompt 'bad': `member_lengths` entries must be ints > 0"),
    ([good(1), '{"id": "n2"}'], ":2: prompt 'n2' needs exactly one of `prompt` or `input_ids`"),
    (['{"prompt": "x"}'], ":1: `id` must be a non-empty string"),
    (['{"id": "n1", "prompt": 5}'], ":1: prompt 'n1': `prompt` must be a string"),
    (['{"id": "n1", "input_ids": [1, "2"]}'],
     ":1: prompt 'n1': `input_ids` must be a non-empty list of ints >= 0"),
    (['{"id": "big", "prompt": "' + "x" * 300 + '"}'],
     ":1: prompt 'big' is 324 bytes, over limits.max_prompt_bytes = 200"),
    (['{"id": "n1", "prompt": "x", "weight": NaN}'],
     ":1: prompt 'n1' is not JSON: NaN and infinities are not JSON"),
    (['{"id": "n1", "prompt": "\\ud800"}'],
     ":1: prompt 'n1' is not JSON: a lone surrogate (\\ud800-\\udfff) is not Unicode text"),
])
def test_bad_prompt_files_exit_2_and_change_nothing(farm, tmp_path, r, redis_snapshot,
                                                     lines, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = redis_snapshot()
    out = submit_cli(path, farm)
    assert (out.returncode, out.stderr) == (2, f"queue-rollout: {path}{message}\n")
    assert redis_snapshot() == before
    assert not any(r.hexists("qr:{bi}:prompts", f"n{i}") for i in range(1, 6))


def test_ids_already_in_the_farm_refuse_the_whole_file(farm, tmp_path, r, redis_snapshot):
    path = tmp_path / "prompts.jsonl"
    again = '{"id": "%s", "prompt": "x", "member_lengths": [1, 1]}'
    path.write_text("\n".join([good(1), again % "a", good(2), again % "b"]) + "\n")
    before = redis_snapshot()
    out = submit_cli(path, farm)
    assert (out.returncode, out.stderr) == (
        2, f"queue-rollout: {path}: nothing submitted: 2 ids already known to the farm: "
           "'a' (line 2), 'b' (line 4)\n")
    assert redis_snapshot() == before


@pytest.mark.parametrize("extra,message", [
    ("grup_size = 2\n", "rollout.grup_size: unknown key (did you mean group_size?)"),
    ('batch_size = "16"\n', "rollout.batch_size: Expected `int`, got `str`"),
    ("[rollout.extra]\nx = 1\n", "rollout.extra: unknown key"),
    ("[sampling]\ntemperature = 1.0\n", "sampling: unknown key (did you mean workflow.sampling?)"),
])
def test_bad_config_exits_2_naming_the_key_and_changes_nothing(farm, tmp_path, redis_url,
                                                               redis_snapshot, extra, message):
    toml = _farm_toml(tmp_path / "bad.toml", redis_url, extra)
    path = tmp_path / "prompts.jsonl"
    path.write_text(good(1) + "\n")
    before = redis_snapshot()
    out = submit_cli(path, toml)
    assert (out.returncode, out.stderr) == (2, f"queue-rollout: {toml}: {message}\n")
    assert redis_snapshot() == before


def test_missing_and_non_utf8_files_exit_2_and_change_nothing(farm, tmp_path, redis_snapshot):
    before = redis_snapshot()
    missing = tmp_path / "missing.jsonl"
    out = submit_cli(missing, farm)
    assert (out.returncode, out.stderr) == (
        2, f"queue-rollout: {missing}: cannot read: No such file or directory\n")
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(f"{good(1)}\n".encode() + b'{"id": "n2", "prompt": "caf\xe9"}\n')
    out = submit_cli(latin1, farm)
    assert (out.returncode, out.stderr) == (
        2, f"queue-rollout: {latin1}:2: not UTF-8 text (byte 0xe9 at byte 28 of the line)\n")
    assert redis_snapshot() == before


def test_a_good_file_is_submitted_whole(farm, tmp_path, r, redis_snapshot):
    """The other side of the tests above: a BOM, CRLF line ends and a U+2028 inside a
    string are fine, and the snapshot does see the new prompts."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(
        [good(1), '{"id": "n2", "prompt": "a\u2028b\x85c", "member_lengths": [1, 1]}', "",
         good(3)]).encode() + b"\r\n")
    before = redis_snapshot()
    out = submit_cli(path, farm)
    assert (out.returncode, out.stdout) == (0, "submitted 3 prompts to farm bi\n"), out.stderr
    assert redis_snapshot() != before
    assert r.lrange("qr:{bi}:pending", 0, -1) == [b"b", b"n1", b"n2", b"n3"]
    assert json.loads(r.hget("qr:{bi}:prompts", "n2"))["prompt"] == "a\u2028b\x85c"


@pytest.mark.parametrize("value,message", [
    ("-1", "set-version: N must be >= 0, got -1"),
    ("1.5", "argument N: invalid int value: '1.5'"),
    ("ten", "argument N: invalid int value: 'ten'"),
])
def test_set_version_refuses_bad_values_and_changes_nothing(farm, redis_snapshot, value,
                                                            message):
    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    assert exe is not None
    before = redis_snapshot()
    out = subprocess.run([exe, "set-version", value, "-c", str(farm)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert redis_snapshot() == before


@pytest.mark.parametrize("argv", [["up"], ["collector"], ["status"], ["submit", "x.jsonl"],
                                  ["worker", "--gpu", "0", "--engine-url", "http://x"],
                                  ["node", "--gpus", "0"], ["sim-engine", "--port", "0"]])
def test_every_command_refuses_an_unknown_workflow_at_once(tmp_path, argv):
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[farm]\nstate_dir = "{tmp_path / "state"}"\n[workflow]\nname = "nope"\n')
    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    assert exe is not None
    out = subprocess.run([exe, *argv, "-c", str(toml)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"queue-rollout: {toml}: workflow.name: 'nope' is neither")
    assert not (tmp_path / "state").exists()  # nothing was started


def test_bench_without_a_profile_lists_them_and_runs_nothing(capsys):
    from queue_rollout.lab.bench.cli import BENCH_PROFILES

    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert all(f"  {name} " in err for name in BENCH_PROFILES) and "30 min" in err


def test_bench_out_without_matplotlib_refuses_before_running(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    started = []
    monkeypatch.setattr("queue_rollout.lab.bench.main.run_bench", lambda *a: started.append(a))
    assert main(["bench", "--profile", "equal", "--out", str(tmp_path / "o")]) == 2
    assert "matplotlib" in capsys.readouterr().err and started == []
