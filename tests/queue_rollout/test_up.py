"""`queue-rollout up`, then the CLI against it: submit, consume, status, pause."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from queue_rollout.embedded import free_port

EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_up_runs_a_farm_the_other_commands_find(tmp_path):
    state = tmp_path / "state"
    metrics_port = free_port()
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[farm]\nname = "up"\nstate_dir = "{state}"\n'
                    "[rollout]\ngroup_size = 2\nbatch_size = 2\nmax_concurrent_samples = 8\n"
                    "[engine]\nreplicas = 2\nslots_per_replica = 2\nstep_ms = 0.5\n"
                    "step_ms_per_request = 0.0\n"
                    f"[metrics]\nport = {metrics_port}\n[timeouts]\nshutdown_grace = 2\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "x",
                                           "member_lengths": [40, 80]}) + "\n"
                               for i in range(8)))
    up = subprocess.Popen([EXE, "up", "-c", str(toml)], stdout=subprocess.PIPE, text=True)
    try:
        line = up.stdout.readline()
        assert "farm up up: redis redis://127.0.0.1:" in line and "2 workers" in line
        assert (state / "redis.url").exists()
        assert cli("submit", str(prompts), "-c", str(toml)).returncode == 0
        consumed = cli("consume", "--batches", "2", "--json", "-c", str(toml))
        assert consumed.returncode == 0, consumed.stderr
        batches = [json.loads(x) for x in consumed.stdout.splitlines()]
        assert [len(b["groups"]) for b in batches] == [2, 2]
        for b in batches:
            for g in b["groups"]:
                assert [m["output_tokens"] for m in g["members"]] == [40, 80]
        status = json.loads(cli("status", "--json", "-c", str(toml)).stdout)
        assert status["workers"] == {"alive": 2, "slots": 4} and status["version"] == 2
        assert status["groups"]["consumed"] == 4
        paused = cli("pause", "-c", str(toml))
        assert paused.returncode == 0 and "every live worker confirmed" in paused.stdout
        assert cli("resume", "-c", str(toml)).returncode == 0
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                         timeout=5).read().decode()
        assert "queue_rollout_groups_consumed_total 4.0" in metrics
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0
    assert not (state / "redis.url").exists()
