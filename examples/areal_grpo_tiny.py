"""AReaL's inference engine on a queue-rollout farm: the key-to-answer task of
``grpo_tiny.py``, its rollouts drawn through :class:`FarmInferenceEngine` in the order
AReaL's trainer drives an engine, every step's weights loaded by every replica.

Each step is AReaL's (``areal/trainer/rl_trainer.py`` and the FSDP engine's disk weight
update): ``prepare_batch`` (AReaL's ``RLVRWorkflow``, run on the farm as
``grpo_tiny:KeyAnswer``), the GRPO step on AReaL's batch dicts, ``pause``, then
``pause_generation``, ``update_weights_from_disk`` (a future), the checkpoint saved and
signalled through AReaL's ``name_resolve``, the future's result, ``continue_generation``,
``set_version``, ``resume``. The dataset is a torchdata ``StatefulDataLoader`` of items
(``ids``, ``target``, ``lengths``) whose token ids AReaL's workflow makes.

``--compare`` replays each delivered group to AReaL's own code: ``RLVRWorkflow`` under
``GroupedRolloutWorkflow``, through an engine stub whose ``agenerate`` answers with the
farm's tokens, logprobs and versions, and checks the farm engine's batch dicts equal
AReaL's field by field (dtype, shape, values; AReaL's ``loss_mask`` with the farm's
stale tokens taken out). ``--trainer none`` runs the loop without learning (the
plumbing), as the fast tests do on simulated replicas.

Run it where AReaL is (its API modules; see the Frameworks page), against a farm whose
workflow is ``grpo_tiny:KeyAnswer`` (``PYTHONPATH=examples``)::

    PYTHONPATH=examples queue-rollout up -c farm.toml
    python examples/areal_grpo_tiny.py -c farm.toml --model MODEL_DIR --steps 20 --compare
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_tiny import (
    ANSWER_TOKENS,
    LONG_SHARE,
    LONG_TOKENS,
    NoTrainer,
    TorchTrainer,
    check_versions,
    run_options,
    score,
    task_prompts,
)

from queue_rollout import RolloutClient
from queue_rollout.client.rollout import Batch

RLVR = "areal.workflow.rlvr.RLVRWorkflow"
FARM_WORKFLOW = "grpo_tiny:KeyAnswer"
EXPERIMENT, TRIAL = "areal-grpo-tiny", "farm"


# -- AReaL's side of the task: the items, their token ids, the reward -------------------

def items(n: int, seed: int, group_size: int) -> list[dict[str, Any]]:
    """*n* dataset items (the keys in turn); each member's length drawn from the prompt,
    so that a replayed episode has the same length."""
    out = []
    for p in task_prompts(n, seed, "areal"):
        rng = random.Random(" ".join(map(str, p["input_ids"])))
        out.append({"ids": p["input_ids"], "target": p["target"],
                    "lengths": [LONG_TOKENS if rng.random() < LONG_SHARE else ANSWER_TOKENS
                                for _ in range(group_size)]})
    return out


def item_prompt(data: dict[str, Any]) -> list[int]:
    """RLVRWorkflow's ``data_extract_prompt_fn``."""
    return list(data["ids"])


def item_ids(prompt: list[int], tokenizer: Any, enable_thinking: bool) -> list[int]:
    """RLVRWorkflow's ``get_input_ids_fn``: the prompt is token ids already."""
    return list(prompt)


def key_answer(prompt: str, completions: str, prompt_ids: list[int],
               completion_ids: list[int], target: int, **data: Any) -> float:
    """RLVRWorkflow's ``reward_fn``: the farm workflow's score of the completion."""
    return score(completion_ids, target)


def workflow_kwargs(tokenizer: Any, temperature: float, group_size: int) -> dict[str, Any]:
    from areal.api.cli_args import GenerationHyperparameters

    return {"reward_fn": key_answer, "tokenizer": tokenizer,
            "gconfig": GenerationHyperparameters(n_samples=group_size, temperature=temperature,
                                                 max_new_tokens=LONG_TOKENS),
            "get_input_ids_fn": item_ids, "data_extract_prompt_fn": item_prompt}


# -- AReaL's own code on the farm's episodes ----------------------------------------------

def replay(batch: Batch, kwargs: dict[str, Any], version: int,
           max_staleness: int) -> list[dict[str, Any]]:
    """Each group of *batch* through AReaL's RLVRWorkflow (grouped as AReaL groups), its
    ``agenerate`` answered with the farm's members in order; the stale tokens (older
    than the window at *version*) taken out of AReaL's loss_mask."""
    import torch
    from areal.api.engine_api import InferenceEngine
    from areal.api.io_struct import ModelResponse
    from areal.infra.remote_inf_engine import GroupedRolloutWorkflow
    from areal.workflow.rlvr import RLVRWorkflow

    class Replay(InferenceEngine):  # type: ignore[misc]
        def __init__(self, responses: list[dict[str, Any]]) -> None:
            self.responses = iter(responses)
            self.asked: list[list[int]] = []

        @property
        def initialized(self) -> bool:
            return True

        async def agenerate(self, req: Any) -> Any:
            self.asked.append(list(req.input_ids))
            return ModelResponse(**next(self.responses), tokenizer=req.tokenizer)

    grouped = GroupedRolloutWorkflow(RLVRWorkflow(**kwargs), len(batch.groups[0].members),
                                     logging.getLogger("replay"))
    out = []
    for group in batch.groups:
        data = {k: v for k, v in group.prompt.items() if k not in ("id", "input_ids")}
        engine = Replay([{"input_tokens": list(group.prompt["input_ids"]),
                          "output_tokens": m.output_ids, "output_logprobs": m.logprobs,
                          "output_versions": m.versions,
                          "stop_reason": "length" if m.finish_reason == "length" else "stop"}
                         for m in group.members])
        d = asyncio.run(grouped.arun_episode(engine, data))
        if any(a != group.prompt["input_ids"] for a in engine.asked):
            raise AssertionError(f"group {group.id}: AReaL asked for other prompt ids")
        fresh = (d["versions"] < 0) | (version - d["versions"] <= max_staleness)
        d["loss_mask"] = d["loss_mask"] * fresh.to(torch.int32)
        out.append(d)
    return out


def differences(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[str]:
    """Where the farm engine's dicts differ from AReaL's: key, dtype, shape, values."""
    import torch

    found = []
    if len(ours) != len(theirs):
        return [f"{len(ours)} groups, AReaL's {len(theirs)}"]
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if set(a) != set(b):
            found.append(f"group {i}: keys {sorted(a)} != {sorted(b)}")
            continue
        for k in sorted(a):
            if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape:
                found.append(f"group {i} {k}: {a[k].dtype}{tuple(a[k].shape)} != "
                             f"{b[k].dtype}{tuple(b[k].shape)}")
            elif not torch.equal(a[k], b[k]):
                found.append(f"group {i} {k}: values differ")
    return found


def tensors(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """AReaL's batch dicts as one padded batch for :meth:`TorchTrainer.step_on`."""
    import torch

    width = max(int(d["input_ids"].shape[1]) for d in groups)

    def cat(key: str, dtype: Any) -> Any:
        return torch.cat([torch.nn.functional.pad(d[key], (0, width - d[key].shape[1]))
                          for d in groups]).to(dtype)

    return {"input_ids": cat("input_ids", torch.long),
            "attention_mask": cat("attention_mask", torch.long),
            "loss_mask": cat("loss_mask", torch.long),
            "logprobs": cat("logprobs", torch.float32),
            "rewards": torch.cat([d["rewards"] for d in groups]),
            "group_index": torch.cat([torch.full((d["input_ids"].shape[0],), i)
                                      for i, d in enumerate(groups)])}


def rows(groups: list[dict[str, Any]]) -> list[dict[str, list[Any]]]:
    """Each member's unpadded lists, for the version check."""
    out = []
    for d in groups:
        for r in range(d["input_ids"].shape[0]):
            n = int(d["attention_mask"][r].sum())
            out.append({k: d[k][r, :n].tolist()
                        for k in ("input_ids", "loss_mask", "logprobs", "versions")})
    return out


# -- the loop, in AReaL's trainer's order -------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="the farm's TOML config")
    parser.add_argument("--model", type=Path, required=True,
                        help="the replicas' model folder (the start)")
    parser.add_argument("--trainer", choices=("torch", "none"), default="torch",
                        help="torch (default), or none: the plumbing only")
    parser.add_argument("--compare", action="store_true",
                        help="check every batch dict against AReaL's RLVRWorkflow's")
    run_options(parser)
    args = parser.parse_args(argv)
    from areal.api.cli_args import NameResolveConfig
    from areal.api.io_struct import WeightUpdateMeta
    from areal.utils import name_resolve, names
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import AutoTokenizer

    from queue_rollout.integrations.areal import FarmInferenceEngine

    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    client = RolloutClient.from_config(args.config, consumer=f"areal-grpo-tiny-{args.seed}")
    rollout, sampling = client.config.rollout, client.config.workflow.sampling
    root = args.checkpoints or Path(tempfile.mkdtemp(prefix="areal-grpo-tiny-"))
    name_resolve.reconfigure(NameResolveConfig(type="nfs",
                                               nfs_record_root=str(root / "name_resolve")))
    policy = (TorchTrainer(args.model, lr=args.lr, seed=args.seed) if args.trainer == "torch"
              else NoTrainer())
    # the start: AReaL's servers begin with the actor's weights, named the trainer's step
    start = client.version()
    warm_loss = policy.warm_start(args.warm_start_steps, args.seed)
    checkpoints = {start: policy.save(root / "weight_update_start")}
    client.update_weights(str(checkpoints[start]), start)
    eval_prompts = task_prompts(args.eval_prompts, 10_000 + args.seed, "eval")
    report: dict[str, Any] = {"warm_start_loss": warm_loss, "start_version": start,
                              "eval_before": policy.evaluate(eval_prompts),
                              "admission": rollout.mode, "compared": 0, "differences": [],
                              "steps": []}
    print(f"warm start: loss {warm_loss:.3f}, v{start} loaded; greedy eval "
          f"{report['eval_before']}", flush=True)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    kwargs = workflow_kwargs(tokenizer, sampling.temperature, rollout.group_size)
    loader = StatefulDataLoader(items((args.steps + 4) * rollout.batch_size, args.seed + 1,
                                      rollout.group_size),
                                batch_size=rollout.batch_size, shuffle=False,
                                collate_fn=lambda x: x)
    engine = FarmInferenceEngine(client, workflows={RLVR: FARM_WORKFLOW},
                                 experiment_name=EXPERIMENT, trial_name=TRIAL,
                                 timeout=args.timeout)
    engine.initialize()
    meta = WeightUpdateMeta(type="disk", path=str(root / "weight_update"))
    samples: list[dict[str, Any]] = []
    for global_step in range(start, start + args.steps):
        t0 = time.monotonic()
        batch = engine.prepare_batch(loader, workflow=RLVR, workflow_kwargs=kwargs,
                                     group_size=rollout.group_size)
        waited = time.monotonic() - t0
        delivered = engine.last_batch
        if delivered is None:
            raise RuntimeError("prepare_batch returned without a delivered batch")
        version = engine.get_version()
        if args.compare:
            found = differences(batch, replay(delivered, kwargs, version,
                                              rollout.max_staleness))
            report["compared"] += len(batch)
            report["differences"] += [f"step {global_step + 1}: {d}" for d in found]
        t1 = time.monotonic()
        stats = policy.step_on(tensors(batch))
        t2 = time.monotonic()
        # rl_trainer: pause, the actor's disk update, set_version, resume
        engine.pause()
        t3 = time.monotonic()
        new_version = global_step + 1
        versioned = meta.with_version(new_version)
        engine.pause_generation()  # the FSDP engine's _update_weights_from_disk
        future = engine.update_weights_from_disk(versioned)
        saved = policy.save(Path(versioned.path))
        name_resolve.add(names.update_weights_from_disk(EXPERIMENT, TRIAL, global_step),
                         str(time.time()), keepalive_ttl=120)
        t4 = time.monotonic()
        future.result()
        engine.continue_generation()
        engine.set_version(new_version)
        engine.resume()
        t5 = time.monotonic()
        checkpoints[new_version] = saved
        produced = rows(batch)
        samples += produced
        rewards = [float(r) for d in batch for r in d["rewards"]]
        row = {"step": global_step + 1, "version": version, "pushed": new_version,
               "batch": delivered.id, "groups": [g.id for g in delivered.groups],
               "reward": statistics.fmean(rewards), "wait_s": waited, "train_s": t2 - t1,
               "pause_s": t3 - t2, "save_s": t4 - t3, "update_s": t5 - t4,
               "token_versions": sorted({v for s in produced for v, m in
                                         zip(s["versions"], s["loss_mask"], strict=True) if m}),
               "stats": {**engine.export_stats(), **stats}}
        report["steps"].append(row)
        print(f"step {row['step']}: v{version} reward {row['reward']:.3f} wait {waited:.2f}s "
              f"train {row['train_s']:.2f}s pause {row['pause_s']:.2f}s save "
              f"{row['save_s']:.2f}s update {row['update_s']:.2f}s", flush=True)
    engine.destroy()
    report["eval_after"] = policy.evaluate(eval_prompts)
    report.update(wall_s=time.monotonic() - started, final_version=client.version(),
                  checkpoints={v: str(p) for v, p in checkpoints.items()},
                  path=str(checkpoints[max(checkpoints)]))
    rewards = [s["reward"] for s in report["steps"]]
    print(f"greedy eval on {len(eval_prompts)} held-out prompts: {report['eval_before']} -> "
          f"{report['eval_after']} (sampled reward, mean of {len(rewards)} steps: "
          f"{statistics.fmean(rewards) if rewards else math.nan:.3f})", flush=True)
    if args.compare:
        print(f"batch dicts compared with AReaL's RLVRWorkflow: {report['compared']} groups, "
              f"{len(report['differences'])} differences", flush=True)
    if args.check_versions:
        check_versions(report, samples, checkpoints)
    if args.json:
        args.json.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
