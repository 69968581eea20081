"""The command line: exit codes, status, config errors; the console script itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from queue_rollout.cli import main
from queue_rollout.testing import trivial_prompts


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "farm.toml"
    path.write_text("[rollout]\nmax_concurrent_samples = 0\n")
    assert main(["status", "-c", str(path)]) == 2
    assert "rollout.max_concurrent_samples" in capsys.readouterr().err


def test_status_json_has_the_design_shape(tmp_path, redis_url, make_ledger, capsys):
    ledger = make_ledger(group_size=2, max_concurrent_samples=6)
    ledger.submit(trivial_prompts(3))
    aid = ledger.admit().attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)
    path = tmp_path / "farm.toml"
    path.write_text(f'[farm]\nname = "t"\nredis_url = "{redis_url}"\n'
                    "[rollout]\ngroup_size = 2\nmax_concurrent_samples = 6\n")
    assert main(["status", "--json", "-c", str(path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["mode"] == "sample" and (s["capacity"], s["reserved"]) == (6, 2)
    assert s["active_episodes"] == 1 and s["groups"]["pending"] == 2
    assert s["groups"]["in_flight"] == 1 and set(s["workers"]) == {"alive", "slots"}
    assert main(["status", "-c", str(path)]) == 0
    assert "slots     2/6 reserved, 1 running, 0 doubtful" in capsys.readouterr().out


def test_status_without_a_farm_says_how_to_start_one(tmp_path, capsys):
    path = tmp_path / "farm.toml"
    path.write_text(f'[farm]\nstate_dir = "{tmp_path / "nothing"}"\n')
    assert main(["status", "-c", str(path)]) == 4
    assert "queue-rollout up" in capsys.readouterr().err


def test_console_script_is_installed():
    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))
    assert exe is not None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("queue-rollout ")
