"""The AReaL integration, in the venv that has AReaL's API modules (its Python found by
``real_engine.server.find_areal_python``; the tests skip without it, and fail in CI):
the engine's refusals and its stale-token mask, and ``examples/areal_grpo_tiny.py``
driving the engine in AReaL's trainer order against a farm of simulated replicas, its
batch dicts compared with what AReaL's own RLVRWorkflow makes of the same episodes; and
the trainer hook the farm overrides (checked against AReaL's source; its override and
refusal need no AReaL)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from real_engine.server import model

from queue_rollout import RolloutClient
from queue_rollout.cli.main import main as cli
from queue_rollout.errors import BadInput
from testkit import farm_up, grpo_sim_farm, write_farm

ROOT = Path(__file__).resolve().parents[3]
G, B = 4, 2


PROBE = r'''
import asyncio, json, sys
from types import SimpleNamespace
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import WeightUpdateMeta
from queue_rollout import RolloutClient
from queue_rollout.client.training import Sample
from queue_rollout.integrations.areal import FarmInferenceEngine, group_dict

client = RolloutClient.from_config(sys.argv[1])
RLVR = "areal.workflow.rlvr.RLVRWorkflow"
engine = FarmInferenceEngine(client, workflows={RLVR: "generate", "x.Other": "math"})
engine.initialize()
item = {"input_ids": [1, 2, 3]}
out = {}
def refusal(name, call):
    try:
        call()
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"
    else:
        out[name] = "accepted"
refusal("agenerate", lambda: asyncio.run(engine.agenerate(None)))
refusal("unmapped", lambda: engine.submit(item, "x.Unknown", group_size=4))
refusal("other_farm_workflow", lambda: engine.submit(item, "x.Other", group_size=4))
refusal("should_accept_fn", lambda: engine.submit(item, RLVR, group_size=4,
                                                  should_accept_fn=lambda t: True))
refusal("is_eval", lambda: engine.submit(item, RLVR, group_size=4, is_eval=True))
refusal("group_size", lambda: engine.submit(item, RLVR, group_size=8))
refusal("temperature", lambda: engine.submit(
    item, RLVR, {"gconfig": GenerationHyperparameters(temperature=0.5)}, group_size=4))
refusal("dataloader", lambda: engine.prepare_batch(SimpleNamespace(batch_size=3), RLVR,
                                                   group_size=4))
refusal("no_names", lambda: engine.update_weights_from_disk(
    WeightUpdateMeta(type="disk", path="/x")))
named = FarmInferenceEngine(client, workflows={}, experiment_name="e", trial_name="t")
refusal("unpaused_update", lambda: named.update_weights_from_disk(
    WeightUpdateMeta(type="disk", path="/x")))
out["pending"] = client.status()["groups"]["pending"]
# a member whose first two tokens are older than the window: out of AReaL's loss_mask
s = Sample("g", 0, [7, 8, 9, 10, 11], [0, 1, 1, 1, 1], [0.0, -.1, -.2, -.3, -.4],
           [-1, 1, 1, 3, 3], [0, 1, 1, 0, 0], 1.0, "length", 1, [(1, 5)])
d = group_dict([s, Sample("g", 1, [7, 8], [0, 1], [0.0, -.5], [-1, 3], [0, 0], 0.0,
                          "length", 1, [(1, 2)])])
out["dict"] = {k: [str(v.dtype), v.tolist()] for k, v in d.items()}
out["failed_only"] = group_dict([Sample("g", 0, [7], [0], [0.0], [-1], [0], None,
                                        "failed", 1, [])])
print(json.dumps(out))
'''


def test_what_the_farm_cannot_serve_is_refused_and_stale_tokens_leave_the_loss_mask(
        areal_python, tmp_path, redis_url):
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "areal", "redis_url": redis_url},
                      rollout={"group_size": G, "batch_size": B}, workflow={"name": "generate"})
    proc = subprocess.run([areal_python, "-c", PROBE, str(toml)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out.pop("pending") == 0  # nothing refused reached the farm
    expected = {
        "agenerate": "NotImplementedError: a farm engine does not generate",
        "unmapped": "BadInput: AReaL workflow 'x.Unknown' has no farm workflow",
        "other_farm_workflow": "maps to farm workflow 'math', but the farm runs 'generate'",
        "should_accept_fn": "should_accept_fn is not supported",
        "is_eval": "evaluation through the farm is not supported",
        "group_size": "group_size = 8, but the farm's groups are rollout.group_size = 4",
        "temperature": "gconfig.temperature 0.5 is not the farm's",
        "dataloader": "batch_size 3 is not the farm's rollout.batch_size = 2",
        "no_names": "experiment_name and trial_name must be given",
        "unpaused_update": "update_weights_from_disk outside a pause",
    }
    for name, text in expected.items():
        assert text in out[name], (name, out[name])
    d = out["dict"]
    assert d["loss_mask"] == ["torch.int32", [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0]]]
    assert d["input_ids"] == ["torch.int32", [[7, 8, 9, 10, 11], [7, 8, 0, 0, 0]]]
    assert d["versions"] == ["torch.int32", [[-1, 1, 1, 3, 3], [-1, 3, 0, 0, 0]]]
    assert d["attention_mask"] == ["torch.bool", [[True] * 5, [True, True] + [False] * 3]]
    assert d["rewards"] == ["torch.float32", [1.0, 0.0]]
    assert d["logprobs"][0] == "torch.float32"
    assert out["failed_only"] is None


WAITS = r'''
import json, sys
from queue_rollout import RolloutClient
from queue_rollout.integrations.areal import FarmInferenceEngine

RLVR = "areal.workflow.rlvr.RLVRWorkflow"
client = RolloutClient.from_config(sys.argv[1], consumer="waits")
engine = FarmInferenceEngine(client, workflows={RLVR: "grpo_tiny:KeyAnswer"}, timeout=60)
engine.initialize()
items = [{"input_ids": [401, 402, 403, 200 + k], "target": k} for k in range(4)]
heads = lambda dicts: [d["input_ids"][:, 3].tolist() for d in dicts]
out = {"rollout_batch": heads(engine.rollout_batch(items[:2], RLVR, group_size=4))}
out["consumed"] = [client.ledger.counters().get("consumed", 0)]
engine.set_version(1)  # the step is trained: its batch acknowledged
out["consumed"].append(client.ledger.counters().get("consumed", 0))
tasks = [engine.submit(item, RLVR, group_size=4) for item in items[2:]]
out["wait_for_task"] = heads([engine.wait_for_task(tasks[1])])
out["wait"] = heads(engine.wait(1))
try:  # the farm hands a consumer one batch at a time
    engine.wait(1, timeout=5)
except Exception as exc:
    out["held"] = f"{type(exc).__name__}: {exc}"
engine.set_version(2)
out["consumed"].append(client.ledger.counters().get("consumed", 0))
engine.workflow_executor.staleness_manager.on_version_recovered(3)
out["recovered"] = client.version()
st = engine.workflow_executor.staleness_manager.get_stats()
out["rollout_stat"] = [st.accepted, st.enqueued, st.running, st.rejected]
stats = engine.export_stats()
out["stats"] = [stats["farm/batches"], stats["farm/groups"]]
engine.destroy()
print(json.dumps(out))
'''


def test_engine_driven_in_areal_trainer_order_on_simulated_replicas(
        areal_python, tmp_path, monkeypatch):
    """The engine's waits, then 3 steps of AReaL's order: each batch dict equal to
    AReaL's RLVRWorkflow's for the same episodes, each step's weights loaded as the next
    version by every worker before generation resumes, every batch acknowledged at the
    next set_version."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "examples"))  # the workers' workflow
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # and the config check here
    toml = grpo_sim_farm(tmp_path, "areal", group_size=G, batch_size=B)
    weights = model(areal_python, 0, vocab=32_128)  # its tokenizer; nothing is trained
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'examples'}{os.pathsep}{ROOT}"}
    with farm_up(toml) as line:
        assert "2 workers" in line
        # first the waits a trainer of its own uses: submit, wait_for_task, wait,
        # rollout_batch (in the items' order), and the recovery AReaL's trainer calls
        proc = subprocess.run([areal_python, "-c", WAITS, str(toml)], capture_output=True,
                              text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        waits = json.loads(proc.stdout.splitlines()[-1])
        assert waits["rollout_batch"] == [[200] * G, [201] * G]
        assert waits["wait_for_task"] == [[203] * G] and waits["wait"] == [[202] * G]
        assert waits["consumed"] == [0, B, 2 * B]  # each batch acked at set_version
        assert "BadInput: this engine holds farm batch" in waits["held"]
        assert waits["recovered"] == 3 and waits["stats"] == [2, 2 * B]
        assert waits["rollout_stat"] == [2 * B, 0, 0, 0]  # AReaL's accepted: ever
        proc = subprocess.run(
            [areal_python, str(ROOT / "examples" / "areal_grpo_tiny.py"), "-c", str(toml),
             "--model", str(weights), "--trainer", "none", "--steps", "3", "--compare",
             "--eval-prompts", "8", "--checkpoints", str(tmp_path / "ckpt"),
             "--json", str(tmp_path / "report.json")],
            capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        assert cli(["doctor", "-c", str(toml)]) == 0
        client = RolloutClient.from_config(toml)
        assert client.version() == 6 and client.ledger.counters()["consumed"] == 5 * B
    report = json.loads((tmp_path / "report.json").read_text())
    steps = report["steps"]
    assert report["start_version"] == 3  # the farm's version, where AReaL's steps go on
    assert report["compared"] == 3 * B and report["differences"] == []
    assert [s["pushed"] for s in steps] == [4, 5, 6]
    assert [s["version"] for s in steps] == [3, 4, 5]
    assert all(max(s["token_versions"]) <= s["version"] for s in steps)
    assert steps[0]["token_versions"] == [3]
    groups = [g for s in steps for g in s["groups"]]
    assert len(groups) == len(set(groups)) == 3 * B
    assert all(s["stats"]["farm/groups"] == B for s in steps)
    assert Path(report["path"]).name == "weight_update_v6"


# -- the trainer's rollout hook ---------------------------------------------------------


class Engine:
    """What with_farm_rollout builds and initializes."""

    def __init__(self, config: object) -> None:
        self.config, self.initialized = config, False

    def initialize(self) -> None:
        self.initialized = True


class TrainerOf104:
    """AReaL 1.0.4's PPOTrainer, as far as the hook goes."""

    def _init_rollout(self, rollout_config, is_eval=False, lora_path=None):
        return ("areal's own engine", rollout_config, is_eval, lora_path)


def test_the_farm_builds_the_training_rollout_and_evaluation_keeps_areal_s():
    from queue_rollout.integrations.areal import with_farm_rollout

    farm_trainer = with_farm_rollout(TrainerOf104, Engine)
    assert issubclass(farm_trainer, TrainerOf104) and farm_trainer.__name__ == "FarmTrainerOf104"
    trainer = farm_trainer()
    engine = trainer._init_rollout("cfg", is_eval=False, lora_path=None)
    assert isinstance(engine, Engine) and engine.config == "cfg" and engine.initialized
    assert trainer._init_rollout("cfg", is_eval=True) == ("areal's own engine", "cfg", True, None)
    with pytest.raises(BadInput, match="LoRA"):
        trainer._init_rollout("cfg", lora_path="/lora")


def test_a_trainer_whose_hook_changed_is_refused_naming_it():
    from queue_rollout.integrations.areal import with_farm_rollout

    class Renamed:
        def _init_rollout(self, config, eval_mode=False):
            return None

    with pytest.raises(BadInput) as refused:
        with_farm_rollout(Renamed, Engine)
    message = str(refused.value)
    assert ("Renamed._init_rollout takes (self, config, eval_mode), where AReaL 1.0.4 takes "
            "(self, rollout_config, is_eval, lora_path)") in message
    assert "training loop of your own" in message
    with pytest.raises(BadInput, match="_init_rollout has none"):
        with_farm_rollout(object, Engine)


def test_the_installed_areal_s_trainer_has_the_hook_the_farm_overrides(areal_python):
    """Read from AReaL's source (its trainer module imports more than the API venv
    holds): PPOTrainer._init_rollout takes what with_farm_rollout expects."""
    import ast

    from queue_rollout.integrations.areal import ROLLOUT_HOOK

    origin = subprocess.run(
        [areal_python, "-c", "import importlib.util; print(importlib.util.find_spec("
                             "'areal').submodule_search_locations[0])"],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    tree = ast.parse((Path(origin) / "trainer" / "rl_trainer.py").read_text())
    [trainer] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PPOTrainer"]
    [hook] = [n for n in trainer.body
              if isinstance(n, ast.FunctionDef) and n.name == "_init_rollout"]
    assert tuple(a.arg for a in hook.args.args) == ROLLOUT_HOOK
