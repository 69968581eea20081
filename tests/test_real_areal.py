"""AReaL's inference engine on the farm with real replicas, SGLang's (``pytest -m
sglang``) and vLLM's (``pytest -m vllm``): ``examples/areal_grpo_tiny.py`` runs in the
venv that has AReaL's API modules against ``queue-rollout up`` on two replicas, driving
:class:`FarmInferenceEngine` in AReaL's trainer order; every step's checkpoint is loaded
by both replicas through the engine's disk weight update before generation resumes
(checked by recomputing the rollout's logprobs under each checkpoint), and every batch
dict equals what AReaL's own RLVRWorkflow makes of the same episodes.

``QUEUE_ROLLOUT_AREAL_MODES`` names the admission modes to run (``sample`` by default: the
tier's run; ``sample,group`` for both), ``QUEUE_ROLLOUT_AREAL_STEPS`` the steps of each
run (4 by default: the loop, not learning, which the documented runs measure);
``QUEUE_ROLLOUT_AREAL_OUT``, a folder, keeps each run's report there as
``areal-MODE.json`` (``areal-vllm-MODE.json`` on vLLM)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from faultfarm import FSYNC, FaultServer, UpFarm, doctor, model_info, restored, weight_version
from real_engine.server import find_areal_python, model
from real_engine.vllm_server import VLLMServer, untied_model

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[1]
STEPS = int(os.environ.get("QUEUE_ROLLOUT_AREAL_STEPS", "4"))
MODES = os.environ.get("QUEUE_ROLLOUT_AREAL_MODES", "sample").split(",")
G, B = 16, 4


@pytest.mark.sglang
@pytest.mark.parametrize("mode", MODES)
def test_areal_engine_drives_real_replicas_with_disk_weight_updates(
        mode: str, tmp_path: Path, replicas: list[FaultServer], sglang_interpreter: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = run_areal(mode, "sglang", [s.url for s in replicas],
                       model(sglang_interpreter, 0), tmp_path, monkeypatch)
    assert all(model_info(s.url)["model_path"] == report["path"] for s in replicas)
    check(report, "sglang", mode)


@pytest.mark.vllm
@pytest.mark.parametrize("mode", MODES)
def test_areal_engine_drives_vllm_replicas_with_disk_weight_updates(
        mode: str, tmp_path: Path, vllm_replicas: list[VLLMServer], vllm_python: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same run on two vLLM replicas of the untied tiny model; the replicas get
    their first weights back after."""
    start = untied_model(vllm_python, 0)
    with restored(vllm_replicas, start):
        report = run_areal(mode, "vllm", [s.url for s in vllm_replicas], start, tmp_path,
                           monkeypatch)
        final = str(report["final_version"])
        assert all(weight_version(s.url) == final for s in vllm_replicas)
    check(report, "vllm", mode)


def run_areal(mode: str, kind: str, urls: list[str], start: Path, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``examples/areal_grpo_tiny.py`` from the weights in *start* against ``up`` on the
    replicas (of *kind*) at *urls*; its report."""
    python = find_areal_python()
    if python is None:
        pytest.fail("no AReaL venv: .ci/run makes it (AReaL's API modules and this "
                    "checkout), or name its Python in QUEUE_ROLLOUT_AREAL_PYTHON")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples"))  # the workers' workflow
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # and the config check here
    farm = UpFarm(tmp_path / "farm", f"areal-{kind}", urls, mode,
                  {"group_size": G, "batch_size": B, "groups_at_once": 2,
                   "max_staleness": 1, "pause_mode": "abort", "kind": kind,
                   "workflow": "grpo_tiny:KeyAnswer", "lease": 10},
                  appendfsync=FSYNC)
    report_path = tmp_path / "report.json"
    with farm.running():
        proc = subprocess.run(
            [python, str(ROOT / "examples" / "areal_grpo_tiny.py"),
             "-c", str(farm.toml), "--model", str(start),
             "--steps", str(STEPS), "--checkpoints", str(tmp_path / "ckpt"), "--compare",
             "--check-versions", "--json", str(report_path)],
            capture_output=True, text=True, timeout=840, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'examples'}{os.pathsep}{ROOT}"})
        print(proc.stdout[-6000:])
        assert proc.returncode == 0, proc.stderr[-4000:] + farm.log_tail()
        report: dict[str, Any] = json.loads(report_path.read_text())
        doctor(farm.toml)
    return report


def check(report: dict[str, Any], kind: str, mode: str) -> None:
    """What every run must show; the report kept where ``QUEUE_ROLLOUT_AREAL_OUT`` says."""
    if out := os.environ.get("QUEUE_ROLLOUT_AREAL_OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        kept = {k: v for k, v in report.items() if k not in ("checkpoints", "samples")}
        name = f"areal-{mode}.json" if kind == "sglang" else f"areal-{kind}-{mode}.json"
        (Path(out) / name).write_text(json.dumps(kept, indent=1) + "\n")
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
