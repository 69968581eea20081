"""``plan --from-farm``: the group shapes a running farm recorded, replayed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from queue_rollout.config import load_config
from queue_rollout.lab.demo.stack import GROUP, demo_prompts
from queue_rollout.lab.sim.server import text_tokens
from queue_rollout.ledger.connection import connect_config
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.group_shapes import recorded_shapes
from queue_rollout.ledger.keys import Keys
from testkit import farm_up, wait_for, write_farm, write_up_farm

EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent)) or "queue-rollout"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_the_shapes_a_farm_recorded_are_its_prompts(tmp_path: Path) -> None:
    toml = write_up_farm(tmp_path / "farm.toml", "shapes", tmp_path / "state", slots=8,
                         metrics_port=free_port(),
                         rollout={"group_size": GROUP, "batch_size": 2,
                                  "max_concurrent_samples": 16, "max_staleness": 100})
    prompts = demo_prompts(8)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    config = load_config(str(toml))
    with farm_up(toml):
        assert cli("submit", str(path), "-c", str(toml)).returncode == 0

        def kept() -> int:
            return int(json.loads(cli("status", "--json", "-c", str(toml)).stdout)
                       ["shapes_kept"])

        wait_for(lambda: kept() == len(prompts), 90, "every group's shape kept")
        client = connect_config(config)
        try:
            history = recorded_shapes(client, Keys(config.farm.name))
        finally:
            client.close()
        planned = cli("plan", "--from-farm", "-c", str(toml), "--gpus", "2",
                      "--slots-per-replica", "8", "--batch-size", "2", "--batches", "4",
                      "--json", "--seed", "3")
        # without flags, the farm's own shape: its 2 live workers, 8 slots, B=2
        own = cli("plan", "--from-farm", "-c", str(toml), "--batches", "1", "--modes", "group")
        # flags override it
        flagged = cli("plan", "--from-farm", "-c", str(toml), "--batches", "1", "--modes",
                      "group", "--gpus", "3", "--slots-per-replica", "4", "--batch-size", "1")
    assert own.returncode == 0, own.stderr
    assert "B=2, 2 GPUs x 8 slots" in own.stderr and "from the farm's live workers" in own.stderr
    assert flagged.returncode == 0, flagged.stderr
    assert "B=1, 3 GPUs x 4 slots" in flagged.stderr
    got = {s["group_id"]: s for s in history}
    assert sorted(got) == sorted(p["id"] for p in prompts)
    for p in prompts:  # each group as the manifest made it: its prompt, its members
        assert got[p["id"]]["prompt_tokens"] == len(text_tokens(p["prompt"]))
        assert got[p["id"]]["members"] == [{"output_tokens": n} for n in p["member_lengths"]]
    assert planned.returncode == 0, planned.stderr
    rows = [json.loads(line) for line in planned.stdout.splitlines()]
    assert [r["mode"] for r in rows] == ["group", "sample"]
    assert all(r["workload"] == "farm shapes" and r["episodes"] == 4 * 2 * GROUP
               for r in rows)


def test_a_farm_with_no_shapes_yet_is_refused(tmp_path: Path, redis_url: str) -> None:
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "empty", "redis_url": redis_url})
    done = cli("plan", "--from-farm", "-c", str(toml))
    assert done.returncode == 2
    assert "farm empty: no group shapes kept yet" in done.stderr
