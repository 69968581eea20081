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
from testkit import farm_up, write_up_farm

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_the_trainer_loop_example_trains_pushes_weights_and_raises_versions(tmp_path):
    toml = write_up_farm(tmp_path / "farm.toml", "ex", tmp_path / "state", slots=4,
                      metrics_port=free_port(),
                      rollout="group_size = 4\nbatch_size = 2\nmax_concurrent_samples = 8")
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
