"""TRL's GRPOTrainer learns through the farm on real SGLang replicas:
``examples/trl_grpo_tiny.py`` runs in the venv that has TRL (SGLang's) against
``queue-rollout up`` on the two shared replicas; TRL computes the rewards and the loss,
every step's weights are loaded by both replicas before the next generation (checked by
recomputing the rollout's logprobs under each checkpoint); the greedy evaluation on
held-out prompts before and after is printed.

``QUEUE_ROLLOUT_TRL_MODES`` names the admission modes to run (``sample`` by default: the
tier's run; ``sample,group`` for both), ``QUEUE_ROLLOUT_TRL_STEPS`` the steps of each run
(4 by default: the loop, not learning, which the documented runs measure);
``QUEUE_ROLLOUT_TRL_OUT``, a folder, keeps each run's report there as ``trl-MODE.json``,
as the documented runs were made."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from faultfarm import FaultServer, UpFarm, doctor, model_info
from real_engine.server import model

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
STEPS = int(os.environ.get("QUEUE_ROLLOUT_TRL_STEPS", "4"))
MODES = os.environ.get("QUEUE_ROLLOUT_TRL_MODES", "sample").split(",")
G, B = 16, 4  # 64 completions a TRL step, on 16 slots


@pytest.mark.parametrize("mode", MODES)
def test_trl_grpo_trainer_learns_through_the_farm_on_real_replicas(
        mode: str, tmp_path: Path, replicas: list[FaultServer], sglang_interpreter: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if subprocess.run([sglang_interpreter, "-c", "import trl"]).returncode != 0:
        pytest.fail("TRL is not installed beside SGLang: pip install 'queue-rollout[trl]' "
                    "in that venv (.ci/run does)")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples"))  # the workers' workflow
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # and the config check here
    farm = UpFarm(tmp_path / "farm", "trl", [s.url for s in replicas], mode,
                  {"group_size": G, "batch_size": B, "groups_at_once": 2,
                   "max_staleness": 1, "pause_mode": "abort",
                   "workflow": "grpo_tiny:KeyAnswer", "lease": 10})
    report_path = tmp_path / "report.json"
    with farm.running():
        proc = subprocess.run(
            [sglang_interpreter, str(ROOT / "examples" / "trl_grpo_tiny.py"),
             "-c", str(farm.toml), "--model", str(model(sglang_interpreter, 0)),
             "--steps", str(STEPS), "--checkpoints", str(tmp_path / "ckpt"),
             "--check-versions", "--json", str(report_path)],
            capture_output=True, text=True, timeout=840, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'examples'}{os.pathsep}{ROOT}"})
        print(proc.stdout[-6000:])
        assert proc.returncode == 0, proc.stderr[-4000:] + farm.log_tail()
        report = json.loads(report_path.read_text())
        last = report["steps"][-1]["path"]
        assert all(model_info(s.url)["model_path"] == last for s in replicas)
        doctor(farm.toml)
    if out := os.environ.get("QUEUE_ROLLOUT_TRL_OUT"):
        Path(out).mkdir(parents=True, exist_ok=True)
        kept = {k: v for k, v in report.items() if k != "checkpoints"}
        kept["steps"] = [{k: v for k, v in s.items() if k != "rows"} for s in report["steps"]]
        (Path(out) / f"trl-{mode}.json").write_text(json.dumps(kept, indent=1) + "\n")
    steps = report["steps"]
    groups = [g for s in steps for g in s["groups"]]
    assert len(groups) == len(set(groups)) == STEPS * B  # whole groups, each once
    v0 = report["start_version"]  # each generation under the last step's weights, alone
    assert [s["token_versions"] for s in steps] == [[v0 + i] for i in range(STEPS)]
    assert report["reward_disagreements"] == 0  # TRL's rows are the farm's, in order
    # learning is printed, not asserted: when TRL's runs take off varies from run to run,
    # and some had not within 120 steps (the documented runs, in Frameworks, list them)
    assert report["eval_before"] <= 0.2  # the start ignores the key (1/8)
    print(f"greedy eval {report['eval_before']} -> {report['eval_after']}")
    # every generation came from the weights the callback pushed: TRL's policy (float32)
    # agrees with the replicas' logprobs (bf16) under the checkpoint each token's version
    # names, and not under the one after
    assert report["logprob_diff"] < 0.05
    assert report["logprob_diff_wrong"] > 3 * report["logprob_diff"]
