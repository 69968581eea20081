"""The learning study's driver (``examples/learning_study.py``) on the two shared
replicas: a farm of its own for a farm arm's run, the local arms without one, one JSON
line per run, and a second invocation that finds every run done. Two steps a run: the
loop, not the learning (the study itself is run by hand; Benchmarks has it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from faultfarm import FaultServer
from real_engine.server import model

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
ARMS = ["grpo-farm", "grpo-local", "trl-local"]


def test_the_study_runs_each_arm_once_per_seed_and_resumes(
        tmp_path: Path, replicas: list[FaultServer], sglang_interpreter: str) -> None:
    out = tmp_path / "runs.jsonl"
    command = [sglang_interpreter, str(ROOT / "examples" / "learning_study.py"),
               "--replicas", ",".join(s.url for s in replicas),
               "--model", str(model(sglang_interpreter, 0)), "--arms", ",".join(ARMS),
               "--seeds", "1", "--steps", "2", "--out", str(out),
               "--workdir", str(tmp_path / "runs")]
    first = subprocess.run(command, capture_output=True, text=True, timeout=500, cwd=tmp_path)
    logs = "\n".join(p.read_text(errors="replace")[-3000:]
                     for p in sorted((tmp_path / "runs").glob("*/*.log")))
    assert first.returncode == 0, first.stdout + first.stderr[-3000:] + logs
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["arm"], r["seed"]) for r in lines] == [(a, 1) for a in ARMS]
    for r in lines:
        assert r["steps"] == 2 and len(r["rewards"]) == len(r["kl"]) == 2
        assert all(0.0 <= x <= 1.0 for x in r["rewards"]) and all(k >= 0 for k in r["kl"])
        assert r["take_off"] in (None, 1, 2)
        assert 0.0 <= r["eval_before"] <= 1.0 and 0.0 <= r["eval_after"] <= 1.0
    # one warm start and one evaluation set for every run
    assert len({r["eval_before"] for r in lines}) == 1
    again = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 run(s) in" in again.stdout and "0 to go" in again.stdout
    assert len(out.read_text().splitlines()) == 3
    # a STOP file in the work folder: the study stops before its next run
    (tmp_path / "runs" / "STOP").touch()
    seed_2 = [*command]
    seed_2[seed_2.index("--seeds") + 1] = "2"
    stopped = subprocess.run(seed_2, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "3 to go" in stopped.stdout and "stopped before grpo-farm seed 2" in stopped.stdout
    assert len(out.read_text().splitlines()) == 3
