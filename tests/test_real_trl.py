"""TRL's GRPOTrainer learns through the farm on real SGLang replicas:
``examples/trl_grpo_tiny.py`` runs in the venv that has TRL (SGLang's) against
``queue-rollout up`` on the two shared replicas; TRL computes the rewards and the loss,
every step's weights are loaded by both replicas before the next generation (checked by
recomputing the rollout's logprobs under each checkpoint); the greedy evaluation on
held-out prompts before and after is printed.

``QUEUE_ROLLOUT_TRL_MODES`` names the admission modes to run (``sample`` by default: the
tier's run; ``sample,group`` for both), ``QUEUE_ROLLOUT_TRL_STEPS`` the steps of each run
(80 by default); ``QUEUE_ROLLOUT_TRL_OUT``, a folder, keeps each run's report there as
``trl-MODE.json``, as the documented runs were made."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from faultfarm import GRPO_FARM, FaultServer, grpo_trainer_run, keep_report
from real_engine.server import model

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

STEPS = int(os.environ.get("QUEUE_ROLLOUT_TRL_STEPS", "80"))
MODES = os.environ.get("QUEUE_ROLLOUT_TRL_MODES", "sample").split(",")
B = GRPO_FARM["batch_size"]  # groups a TRL step (of 16 completions each)


@pytest.mark.parametrize("mode", MODES)
def test_trl_grpo_trainer_learns_through_the_farm_on_real_replicas(
        mode: str, tmp_path: Path, replicas: list[FaultServer], sglang_interpreter: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if subprocess.run([sglang_interpreter, "-c", "import trl"]).returncode != 0:
        pytest.fail("TRL is not installed beside SGLang: pip install 'queue-rollout[trl]' "
                    "in that venv (.ci/run does)")
    report = grpo_trainer_run(
        "trl_grpo_tiny.py", sglang_interpreter, ["--steps", str(STEPS)], name="trl",
        mode=mode, root=tmp_path, replicas=replicas,
        model_dir=model(sglang_interpreter, 0), monkeypatch=monkeypatch,
        last_checkpoint=lambda r: r["steps"][-1]["path"])
    keep_report(report, "QUEUE_ROLLOUT_TRL_OUT", f"trl-{mode}.json", drop=("checkpoints",),
                drop_in_steps=("rows",))
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
