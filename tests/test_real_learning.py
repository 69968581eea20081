"""GRPO learns through the farm on real SGLang replicas: ``examples/grpo_tiny.py`` runs
in the SGLang venv (it has torch) against ``queue-rollout up`` on the two shared
replicas, with ``max_staleness = 1`` and ``pause_mode = "abort"``: every step's weights
are loaded by both replicas before the next rollouts, the greedy evaluation on held-out
prompts rises, the trainer's own forward pass agrees with the replicas' logprobs under
the checkpoint each token's version names, and the staleness budget held.

``QUEUE_ROLLOUT_GRPO_MODES`` names the admission modes to run (``sample`` by default:
the tier's run; ``sample,group`` for both), ``QUEUE_ROLLOUT_GRPO_STEPS`` the steps of
each run (80 by default); ``QUEUE_ROLLOUT_GRPO_OUT``, a folder, keeps each run's report
there as ``grpo-MODE.json`` (without the per-sample lists), as the documented runs were
made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from faultfarm import GRPO_FARM, FaultServer, grpo_trainer_run, keep_report
from real_engine.server import model

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(900)]

STEPS = int(os.environ.get("QUEUE_ROLLOUT_GRPO_STEPS", "80"))
MODES = os.environ.get("QUEUE_ROLLOUT_GRPO_MODES", "sample").split(",")
B, MAX_STALENESS = GRPO_FARM["batch_size"], GRPO_FARM["max_staleness"]


@pytest.mark.parametrize("mode", MODES)
def test_grpo_learns_through_the_farm_on_real_replicas(
        mode: str, tmp_path: Path, replicas: list[FaultServer], sglang_interpreter: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = grpo_trainer_run(
        "grpo_tiny.py", sglang_interpreter, ["--steps", str(STEPS), "--lr", "5e-4"],
        name="learn", mode=mode, root=tmp_path, replicas=replicas,
        model_dir=model(sglang_interpreter, 0), monkeypatch=monkeypatch,
        last_checkpoint=lambda r: r["checkpoints"][str(max(map(int, r["checkpoints"])))])
    keep_report(report, "QUEUE_ROLLOUT_GRPO_OUT", f"grpo-{mode}.json")
    steps = report["steps"]
    groups = [g for s in steps for g in s["groups"]]
    assert len(groups) == len(set(groups)) == STEPS * B  # whole groups, each once
    # the staleness budget (I2) held: counting from the warm start's version v0 (set
    # before anything was consumed), the groups admitted at versions up to v are at most
    # (v - v0 + max_staleness + 1) * B; a group's staleness is the version it was
    # trained under (each row's version before its update) less its admission version
    v0 = min(map(int, report["checkpoints"]))
    admitted = sorted(s["version"] - 1 - st for s in steps for st in s["staleness"])
    assert admitted[0] >= v0
    assert all(k + 1 <= (v - v0 + MAX_STALENESS + 1) * B for k, v in enumerate(admitted))
    # learning: greedy on 64 held-out prompts, where a policy ignoring the key scores 1/8
    assert report["eval_before"] <= 0.2
    assert report["eval_after"] >= report["eval_before"] + 0.3, report["eval_after"]
    # the versions are the checkpoints': the trainer's own forward pass (float32) agrees
    # with the replicas' logprobs (bf16), and not with the checkpoint after
    assert report["logprob_diff"] < 0.05
    assert report["logprob_diff_wrong"] > 3 * report["logprob_diff"]
    if mode == "sample":  # refill: episodes span weight updates, two versions each
        episodes = sum(s["episodes"] for s in steps)
        assert sum(s["spanning"] for s in steps) >= 0.1 * episodes
    # the stale mask: the example checked each step's mask against the versions the
    # replicas named; tokens are masked only in a step that trained a group older than
    # the window (one that finished late: under refill, in some runs and not others)
    for s in steps:
        assert s["masked"] == 0 or max(s["staleness"]) > MAX_STALENESS, s
    print(f"masked {sum(s['masked'] for s in steps)} of {sum(s['produced'] for s in steps)} "
          "produced tokens")
