"""examples/trainer_loop.py runs against a farm started with `queue-rollout up`: pause,
weight updates, set-version and resume, as a trainer would use them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from queue_rollout.config import load_config
from queue_rollout.ledger.connection import connect_config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import free_port
from queue_rollout.procs import cli_exe
from testkit import farm_up, write_up_farm

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_the_trainer_loop_example_trains_pushes_weights_and_raises_versions(tmp_path):
    toml = write_up_farm(tmp_path / "farm.toml", "ex", tmp_path / "state", slots=4,
                         metrics_port=free_port(),
                         rollout={"group_size": 4, "batch_size": 2, "max_concurrent_samples": 8})
    with farm_up(toml) as line:
        assert "2 workers" in line
        proc = subprocess.run(
            [sys.executable, "-P", str(ROOT / "examples" / "trainer_loop.py"), "-c", str(toml),
             "--steps", "4", "--push-every", "2", "--checkpoints", str(tmp_path / "ckpt")],
            capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = proc.stdout.splitlines()
        assert lines[0] == "submitted 8 prompts"
        assert [line.split(":")[0] for line in lines[1:]] == [f"step {i}" for i in (1, 2, 3, 4)]
        assert "weights step-00002 loaded; now v2" in lines[2]
        assert "version raised; now v3" in lines[3]
        assert "weights step-00004 loaded; now v4" in lines[4]
        config = load_config(toml)
        redis = connect_config(config)
        ledger = Ledger.from_config(redis, config)
        assert ledger.version() == 4 and not ledger.paused()
        assert ledger.counters()["consumed"] == 8
        acks = {k.decode(): v.decode() for k, v in redis.hgetall(ledger.keys.acks).items()}
        # every worker loaded the last checkpoint (the second weight update)
        assert sorted(v for k, v in acks.items() if k.startswith("weights:")) == ["2 ok", "2 ok"]
        control = {k.decode(): v.decode() for k, v in redis.hgetall(ledger.keys.control).items()}
        assert json.dumps(control["weights_path"]).endswith('step-00004"')


def test_the_grpo_example_runs_its_loop_through_a_farm_without_torch(tmp_path, monkeypatch):
    """The plumbing of examples/grpo_tiny.py on simulated replicas, under refill with a
    staleness budget of 1 and pause-abort: whole groups, each once, their views checked
    every step (shapes, masks, versions), every step's weights loaded. Nothing learns."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples"))  # the workers' plugin
    toml = write_up_farm(tmp_path / "farm.toml", "grpo", tmp_path / "state", slots=4,
                         metrics_port=free_port(),
                         rollout={"group_size": 4, "batch_size": 2,
                                  "max_concurrent_samples": 12, "max_staleness": 1},
                         workflow={"name": "grpo_tiny:KeyAnswer"},
                         engine={"pause_mode": "abort", "step_ms_per_request": 2.0})
    with farm_up(toml) as line:
        assert "2 workers" in line
        proc = subprocess.run(
            [sys.executable, "-P", str(ROOT / "examples" / "grpo_tiny.py"), "-c", str(toml),
             "--trainer", "none", "--steps", "5", "--checkpoints", str(tmp_path / "ckpt"),
             "--json", str(tmp_path / "report.json")],
            capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        doctor = subprocess.run([cli_exe(), "doctor", "-c", str(toml)], capture_output=True,
                                text=True, timeout=60)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    steps = report["steps"]
    assert [s["version"] for s in steps] == [2, 3, 4, 5, 6]  # v1: the warm start
    groups = [g for s in steps for g in s["groups"]]
    assert len(groups) == len(set(groups)) == 10  # whole groups, each delivered once
    # admitted under an earlier version (the budget counts groups: a group that finishes
    # late can be older than max_staleness; its older tokens are masked, checked each step)
    assert all(st >= 0 for s in steps for st in s["staleness"])
    assert all(s["episodes"] == 8 for s in steps)
    assert sorted(int(v) for v in report["checkpoints"]) == [1, 2, 3, 4, 5, 6]
    assert all((Path(p) / "NOT_WEIGHTS").exists() for p in report["checkpoints"].values())
    assert report["eval_before"] is None and report["admission"] == "sample"
    # the sample views: the prompt (4 ids) then 8 produced tokens, or 64 (the long tail),
    # versions of the farm
    produced = [len(s["loss_mask"]) - 4 for s in report["samples"]]
    assert set(produced) <= {8, 64} and sum(produced) == sum(s["produced"] for s in steps)
    for s in report["samples"]:
        assert s["loss_mask"] == [0] * 4 + [1] * (len(s["loss_mask"]) - 4)
        assert all(1 <= v <= 6 for v in s["versions"][4:]) and s["versions"][:4] == [-1] * 4
    plot = subprocess.run([sys.executable, str(ROOT / "examples" / "plot_grpo.py"),
                           str(tmp_path / "report.json"), "-o", str(tmp_path / "reward.png")],
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
