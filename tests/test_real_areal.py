"""AReaL's inference engine on the farm with real SGLang replicas:
``examples/areal_grpo_tiny.py`` runs in the venv that has AReaL's API modules against
``queue-rollout up`` on the two shared replicas, driving :class:`FarmInferenceEngine` in
AReaL's trainer order; every step's checkpoint is loaded by both replicas through the
engine's disk weight update before generation resumes (checked by recomputing the
rollout's logprobs under each checkpoint), and every batch dict equals what AReaL's own
RLVRWorkflow makes of the same episodes.

``QUEUE_ROLLOUT_AREAL_MODES`` names the admission modes to run (``sample`` by default: the
tier's run; ``sample,group`` for both), ``QUEUE_ROLLOUT_AREAL_STEPS`` the steps of each
run (4 by default: the loop, not learning, which the documented runs measure);
``QUEUE_ROLLOUT_AREAL_OUT``, a folder, keeps each run's report there as
``areal-MODE.json``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from faultfarm import FaultServer, UpFarm, doctor, model_info
from real_engine.server import find_areal_python, model

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
STEPS = int(os.environ.get("QUEUE_ROLLOUT_AREAL_STEPS", "4"))
MODES = os.environ.get("QUEUE_ROLLOUT_AREAL_MODES", "sample").split(",")
G, B = 16, 4


@pytest.mark.parametrize("mode", MODES)
def test_areal_engine_drives_real_replicas_with_disk_weight_updates(
        mode: str, tmp_path: Path, replicas: list[FaultServer], sglang_interpreter: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    python = find_areal_python()
    if python is None:
        pytest.fail("no AReaL venv: .ci/run makes it (AReaL's API modules and this "
                    "checkout), or name its Python in QUEUE_ROLLOUT_AREAL_PYTHON")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples"))  # the workers' workflow
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # and the config check here
    farm = UpFarm(tmp_path / "farm", "areal", [s.url for s in replicas], mode,
                  {"group_size": G, "batch_size": B, "groups_at_once": 2,
                   "max_staleness": 1, "pause_mode": "abort",
                   "workflow": "grpo_tiny:KeyAnswer", "lease": 10})
    report_path = tmp_path / "report.json"
    with farm.running():
        proc = subprocess.run(
            [python, str(ROOT / "examples" / "areal_grpo_tiny.py"),
             "-c", str(farm.toml), "--model", str(model(sglang_interpreter, 0)),
             "--steps", str(STEPS), "--checkpoints", str(tmp_path / "ckpt"), "--compare",
             "--check-versions", "--json", str(report_path)],
            capture_output=True, text=True, timeout=840, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'examples'}{os.pathsep}{ROOT}"})
        print(proc.stdout[-6000:])
        assert proc.returncode == 0, proc.stderr[-4000:] + farm.log_tail()
        report = json.loads(report_path.read_text())
        assert all(model_info(s.url)["model_path"] == report["path"] for s in replicas)
        doctor(farm.toml)
    if out := os.environ.get("QUEUE_ROLLOUT_AREAL_OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        kept = {k: v for k, v in report.items() if k not in ("checkpoints", "samples")}
        (Path(out) / f"areal-{mode}.json").write_text(json.dumps(kept, indent=1) + "\n")
    steps = report["steps"]
    start = report["start_version"]
    assert [s["pushed"] for s in steps] == list(range(start + 1, start + STEPS + 1))
    assert report["final_version"] == start + STEPS
    groups = [g for s in steps for g in s["groups"]]
    assert len(groups) == len(set(groups)) == STEPS * B  # whole groups, each once
    # AReaL's own RLVRWorkflow makes the same dicts of the same episodes
    assert report["compared"] == STEPS * B and report["differences"] == []
    # no token from weights the farm had not loaded when the batch was delivered, and
    # every token the loss keeps within the staleness window
    for s in steps:
        assert max(s["token_versions"]) <= s["version"]
        assert min(s["token_versions"]) >= s["version"] - 1
    # every token came from the checkpoint its version names, not from the one after
    assert report["logprob_diff"] < 0.05
    assert report["logprob_diff_wrong"] > 3 * report["logprob_diff"]
    print(f"greedy eval {report['eval_before']} -> {report['eval_after']}")
