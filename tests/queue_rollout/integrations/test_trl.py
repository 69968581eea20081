"""The TRL integration: its checks in process (no TRL needed), and a real GRPOTrainer
(``examples/trl_grpo_tiny.py``, in the venv that has TRL) against a farm of simulated
replicas: the plumbing (group ids, TRL's order, the versions the callback pushes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from real_engine.server import model

from queue_rollout import RolloutClient
from queue_rollout.cli.main import main as cli
from queue_rollout.errors import BadInput
from queue_rollout.integrations.trl import FarmRollout
from testkit import farm_up, grpo_sim_farm, write_farm

ROOT = Path(__file__).resolve().parents[3]
G, B = 4, 2


def trainer(**fields: Any) -> SimpleNamespace:
    """What the rollout function reads of TRL's trainer."""
    base: dict[str, Any] = {"model": SimpleNamespace(training=True), "num_generations": G,
                            "accelerator": SimpleNamespace(num_processes=1),
                            "temperature": 1.0}
    return SimpleNamespace(**{**base, **fields})


@pytest.fixture
def client(tmp_path, redis_url) -> RolloutClient:
    return RolloutClient.from_config(write_farm(
        tmp_path / "farm.toml", farm={"name": "trl", "redis_url": redis_url},
        rollout={"group_size": G, "batch_size": B}))


@pytest.mark.parametrize("fields,prompts,message", [
    ({"num_generations": 2}, ["a"] * 8, "num_generations = 2, but the farm's groups are"),
    ({}, ["a"] * 4, "TRL asked for 4 completions at once"),
    ({}, ["a"] * 3 + ["b"] * 5, "completion 3's prompt differs"),
    ({"temperature": 0.7}, ["a"] * 8, "TRL's temperature 0.7 is not the farm's"),
    ({"model": SimpleNamespace(training=False)}, ["a"] * 8, "evaluation through the farm"),
    ({"accelerator": SimpleNamespace(num_processes=2)}, ["a"] * 8, "runs as one process"),
])
def test_a_generation_the_farm_cannot_serve_is_refused_before_anything_is_submitted(
        client, tmp_path, fields, prompts, message):
    farm = FarmRollout(client, tmp_path / "ckpt",
                       prompt_fields=lambda p, t: {"input_ids": [1, 2]})
    with pytest.raises(BadInput, match=message):
        farm(prompts, trainer(**fields))
    assert client.status()["groups"]["pending"] == 0


@pytest.mark.parametrize("acceptance", [{"reject_zero_variance": True},
                                        {"max_failed_members": 1}],
                         ids=["reject_zero_variance", "max_failed_members"])
def test_acceptance_rules_on_the_farms_rewards_are_refused(tmp_path, redis_url, acceptance):
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "trl", "redis_url": redis_url},
                      rollout={"group_size": G, "batch_size": B}, acceptance=acceptance)
    with pytest.raises(BadInput, match="TRL"):
        FarmRollout(RolloutClient.from_config(toml), tmp_path / "ckpt")


def trl_python() -> str:
    """The Python that has TRL (SGLang's venv, where CI installs it); the test skips
    without one, and fails in CI."""
    from real_engine.server import find_sglang_python

    python = find_sglang_python()
    if python is None or subprocess.run([python, "-c", "import trl"]).returncode != 0:
        hint = "TRL is not installed beside SGLang (pip install 'queue-rollout[trl]' there)"
        if os.environ.get("CI") == "true":
            pytest.fail(hint)
        pytest.skip(hint)
    return python


def test_grpo_trainer_runs_on_a_farm_of_simulated_replicas(tmp_path, monkeypatch):
    """TRL's own GRPOTrainer, 3 steps: each generation is one batch of the farm, its rows
    in TRL's order (group j's members for prompt j), each step's weights pushed as the
    next version and loaded by every worker, every group delivered once."""
    python = trl_python()
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples"))  # the workers' workflow
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # and the config check here
    toml = grpo_sim_farm(tmp_path, "trl", group_size=G, batch_size=B)
    weights = model(python, 0, vocab=32_128)  # takes the simulated replica's token ids
    with farm_up(toml) as line:
        assert "2 workers" in line
        proc = subprocess.run(
            [python, str(ROOT / "examples" / "trl_grpo_tiny.py"), "-c", str(toml),
             "--model", str(weights), "--steps", "3", "--warm-start-steps", "2",
             "--eval-prompts", "8", "--checkpoints", str(tmp_path / "ckpt"),
             "--json", str(tmp_path / "report.json")],
            capture_output=True, text=True, timeout=240, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'examples'}{os.pathsep}{ROOT}"})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        assert cli(["doctor", "-c", str(toml)]) == 0
        client = RolloutClient.from_config(toml)
        assert client.version() == 4 and client.ledger.counters()["consumed"] == 3 * B
    report = json.loads((tmp_path / "report.json").read_text())
    steps = report["steps"]
    assert report["start_version"] == 1  # the warm start's weights
    assert [s["version"] for s in steps] == [1, 2, 3]  # generated under the pushed weights
    assert [s["token_versions"] for s in steps] == [[1], [2], [3]]
    assert [s["pushed"] for s in steps] == [2, 3, 4]
    assert [s["acked"] for s in steps] == [s["batch"] for s in steps]
    groups = [g for s in steps for g in s["groups"]]
    assert len(set(groups)) == 3 * B
    for s in steps:
        assert s["rows"] == [f"{s['groups'][i // G]}/{i % G}" for i in range(G * B)]
        assert Path(s["path"], "model.safetensors").exists()
    assert report["reward_disagreements"] == 0  # the farm's workflow scored the same rows


def test_prompts_are_tokenized_as_trl_tokenizes_them():
    """Text through the tokenizer's call, a conversation through its chat template with
    the trainer's template and its keyword arguments, as TRL's own generation does."""
    from queue_rollout.integrations.trl import tokenized

    calls: list[tuple[str, Any]] = []

    class Tokenizer:
        def __call__(self, text: list[str]) -> dict[str, list[list[int]]]:
            calls.append(("text", text))
            return {"input_ids": [[1, 2, 3]]}

        def apply_chat_template(self, **kwargs: Any) -> dict[str, list[list[int]]]:
            calls.append(("chat", kwargs))
            return {"input_ids": [[4, 5]]}

    t = trainer(processing_class=Tokenizer(), chat_template="T",
                chat_template_kwargs={"enable_thinking": False})
    assert tokenized("hi", t) == {"input_ids": [1, 2, 3]}
    chat = [{"role": "user", "content": "hi"}]
    assert tokenized(chat, t) == {"input_ids": [4, 5]}
    assert calls[0] == ("text", ["hi"])
    assert calls[1][1] == {"conversation": [chat], "chat_template": "T",
                           "add_generation_prompt": True, "tokenize": True,
                           "return_dict": True, "enable_thinking": False}
