"""TRL's GRPOTrainer learns the key-to-answer task of ``grpo_tiny.py`` with its rollouts
drawn from a queue-rollout farm: TRL computes the rewards, the loss and the optimizer
step; the farm's replicas generate, and load every step's weights.

The task, the farm's workflow (``grpo_tiny:KeyAnswer``), the answer-format warm start
and the greedy evaluation are ``grpo_tiny.py``'s. A TRL prompt is the prompt's token ids
written as text (``"731 1650 402 203"``): :func:`farm_fields` turns it back into ids, the
key's index and each member's length (the long tail, drawn from the prompt), which is
what the farm's workflow needs. TRL's reward function scores the completion ids.

``--sampler local`` draws the same rollouts from the policy in this process instead (the
arm without the farm; the farm's config gives the sizes and the temperature).

Run it where TRL is (``pip install 'queue-rollout[trl]'``; here SGLang's venv) against a
farm whose workflow is ``grpo_tiny:KeyAnswer`` (``PYTHONPATH=examples``), with
``rollout.batch_size`` groups of ``rollout.group_size`` per TRL step::

    PYTHONPATH=examples queue-rollout up -c farm.toml
    python examples/trl_grpo_tiny.py -c farm.toml --model MODEL_DIR --steps 100 --json out.json
"""

from __future__ import annotations

import argparse
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
    KEYS,
    LONG_SHARE,
    LONG_TOKENS,
    TorchTrainer,
    check_versions,
    run_options,
    score,
    task_prompts,
)

from queue_rollout import RolloutClient
from queue_rollout.config import load_config
from queue_rollout.integrations.trl import FarmRollout


def farm_fields(group_size: int) -> Any:
    """TRL's prompt (the ids as text) -> the farm prompt's fields but ``id``."""
    def fields(prompt: str, trainer: Any) -> dict[str, Any]:
        ids = [int(t) for t in prompt.split()]
        rng = random.Random(prompt)
        return {"input_ids": ids, "target": KEYS.index(ids[-1]),
                "lengths": [LONG_TOKENS if rng.random() < LONG_SHARE else ANSWER_TOKENS
                            for _ in range(group_size)]}

    return fields


class LocalRollout:
    """TRL's rollouts sampled from the policy in this process, as the farm would return
    them (the arm without the farm): each generation's B groups of G, on-policy."""

    def __init__(self, policy: TorchTrainer, group_size: int, temperature: float) -> None:
        self.policy, self.group_size, self.temperature = policy, group_size, temperature
        self.fields = farm_fields(group_size)
        self.steps: list[dict[str, Any]] = []

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        g, n = self.group_size, len(self.steps) + 1
        groups = [self.fields(p, trainer) for p in prompts[::g]]
        started = time.monotonic()
        t = self.policy.sample(groups, g, self.temperature)
        width = len(groups[0]["input_ids"])
        out: dict[str, list[Any]] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", "env_mask", "farm_group",
            "farm_reward", "farm_versions")}
        for i, ids in enumerate(t["outputs"]):
            out["prompt_ids"].append(groups[i // g]["input_ids"])
            out["completion_ids"].append(ids)
            out["logprobs"].append(t["logprobs"][i, width:width + len(ids)].tolist())
            out["env_mask"].append([1] * len(ids))
            out["farm_group"].append(f"local-{n}-{i // g}/{i % g}")
            out["farm_reward"].append(float(t["rewards"][i]))
            out["farm_versions"].append([0] * len(ids))
        self.steps.append({"generation": n, "groups": sorted({r.split("/")[0] for r in
                                                             out["farm_group"]}),
                           "wait_s": time.monotonic() - started, "save_s": 0.0,
                           "update_s": 0.0, "version": None})
        return out


class KeyAnswerReward:
    """TRL's reward function: the share of the completion's tokens that are the answer.
    It also keeps, per step, which farm group and member each row came from, and how
    many rows the farm's workflow scored otherwise (their prompts would differ)."""

    __name__ = "key_answer"

    def __init__(self) -> None:
        self.rows: list[list[str]] = []
        self.disagreements = 0

    def __call__(self, completion_ids: list[list[int]], target: list[int],
                 farm_group: list[str], farm_reward: list[float | None],
                 **kwargs: Any) -> list[float]:
        rewards = [score(ids, t) for ids, t in zip(completion_ids, target, strict=True)]
        self.rows.append(farm_group)
        self.disagreements += sum(f is None or abs(f - r) > 1e-9
                                  for f, r in zip(farm_reward, rewards, strict=True))
        return rewards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="the farm's TOML config")
    parser.add_argument("--model", type=Path, required=True,
                        help="the replicas' model folder (the start)")
    run_options(parser)
    args = parser.parse_args(argv)
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.sampler == "local" and args.check_versions:
        parser.error("--sampler local has no versions to check")
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    config_file = load_config(args.config)
    rollout, sampling = config_file.rollout, config_file.workflow.sampling
    root = args.checkpoints or Path(tempfile.mkdtemp(prefix="trl-grpo-tiny-"))
    policy = TorchTrainer(args.model, lr=args.lr, seed=args.seed)
    warm_seed = args.seed if args.warm_start_seed is None else args.warm_start_seed
    warm_loss = policy.warm_start(args.warm_start_steps, warm_seed)
    eval_prompts = task_prompts(args.eval_prompts, 10_000 + warm_seed, "eval")
    probe = policy.probe(eval_prompts)
    movement = [policy.answer_logp(probe)]  # the last step's, then each step's KL
    report: dict[str, Any] = {"warm_start_loss": warm_loss, "seed": args.seed,
                              "eval_before": policy.evaluate(eval_prompts),
                              "admission": rollout.mode if args.sampler == "farm" else "local"}
    checkpoints: dict[int, Path] = {}
    source: FarmRollout | LocalRollout
    if args.sampler == "farm":
        client = RolloutClient.from_config(config_file, consumer=f"trl-grpo-tiny-{args.seed}")
        version = client.version() + 1
        checkpoints[version] = policy.save(root / f"v{version:06d}")
        client.update_weights(str(checkpoints[version]), version)
        report["start_version"] = version
        source = FarmRollout(client, root, prompt_fields=farm_fields(rollout.group_size),
                             timeout=args.timeout)
    else:
        source = LocalRollout(policy, rollout.group_size, sampling.temperature)
    print(f"warm start: loss {warm_loss:.3f}; greedy eval {report['eval_before']}; "
          f"rollouts: {args.sampler}", flush=True)

    rows = [{"prompt": " ".join(map(str, p["input_ids"])), "target": p["target"]}
            for p in task_prompts(args.steps * rollout.batch_size, args.seed + 1, "train")]
    samples: list[dict[str, Any]] = []  # what TRL trained on, for --check-versions

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        out = source(prompts, trainer)
        if args.check_versions:
            samples.extend(
                {"input_ids": p + c, "loss_mask": [0] * len(p) + [1] * len(c),
                 "logprobs": [0.0] * len(p) + lp, "versions": [-1] * len(p) + v}
                for p, c, lp, v in zip(out["prompt_ids"], out["completion_ids"],
                                       out["logprobs"], out["farm_versions"], strict=True))
        return out

    times: list[dict[str, float]] = []

    class StepTimes(TrainerCallback):  # type: ignore[misc]
        """Each step's wall time, before the farm's callback pushes the weights."""

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            times.append({"begin": time.monotonic()})

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times[-1]["step_s"] = time.monotonic() - times[-1]["begin"]
            kl, movement[0] = policy.movement(movement[0], probe)
            times[-1]["kl"] = kl

    # one farm batch per TRL step; trained as grpo_tiny.py trains (a constant step size,
    # no gradient clipping, no KL term, the prompts in order: the keys in turn)
    config = GRPOConfig(
        output_dir=str(root / "trl"), use_cpu=True, bf16=False, seed=args.seed,
        num_generations=rollout.group_size,
        per_device_train_batch_size=rollout.group_size * rollout.batch_size,
        gradient_accumulation_steps=1, max_steps=args.steps, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=0.0, beta=0.0,
        shuffle_dataset=False, gradient_checkpointing=False,
        temperature=sampling.temperature, max_completion_length=LONG_TOKENS,
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True)
    reward = KeyAnswerReward()
    trainer = GRPOTrainer(model=policy.model, reward_funcs=reward, args=config,
                          processing_class=AutoTokenizer.from_pretrained(args.model),
                          train_dataset=Dataset.from_list(rows), rollout_func=rollout_func,
                          callbacks=[StepTimes(), *([source.callback()]
                                                    if isinstance(source, FarmRollout) else [])])
    trainer.train()

    report["eval_after"] = policy.evaluate(eval_prompts)
    logged = [h for h in trainer.state.log_history if "reward" in h]
    rewards = [h["reward"] for h in logged]
    steps = [s for s in source.steps if "groups" in s]
    for s, t, h, rows in zip(steps, times, logged, reward.rows, strict=True):
        s.update(step=s["generation"], reward=h["reward"], loss=h.get("loss"),
                 grad_norm=h.get("grad_norm"), kl=t["kl"],
                 step_s=t["step_s"], train_s=t["step_s"] - s["wait_s"], rows=rows)
    report.update(steps=steps, wall_s=time.monotonic() - started,
                  reward_disagreements=reward.disagreements,
                  checkpoints=sorted({s["path"] for s in steps if "path" in s}))
    for s in steps:
        print(f"step {s['generation']}: v{s['version']} reward {s['reward']:.3f} wait "
              f"{s['wait_s']:.2f}s train {s['train_s']:.2f}s save {s['save_s']:.2f}s update "
              f"{s['update_s']:.2f}s", flush=True)
    mean = statistics.fmean(rewards) if rewards else math.nan
    print(f"greedy eval on {len(eval_prompts)} held-out prompts: {report['eval_before']} -> "
          f"{report['eval_after']} (sampled reward, mean of {len(rewards)} steps: {mean:.3f})",
          flush=True)
    if args.check_versions:
        checkpoints.update((s["pushed"], Path(s["path"])) for s in steps)
        check_versions(report, samples, checkpoints)
    if args.json:
        args.json.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
