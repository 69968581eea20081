"""GRPO through a queue-rollout farm: a tiny Qwen2 learns a task on CPU, every step's
weights loaded by every replica before the next rollouts are drawn.

The task ("key to answer"). A prompt is three noise tokens and a key, one of 8 key
tokens; the answer to key k is answer token k (8 answer tokens). An episode generates
8 tokens, or 64 for about one member in four (a long tail, as real episode lengths
have: most groups hold a member still running when the next weights are loaded); its
reward, computed by the farm's workflow (:class:`KeyAnswer`, loaded by the workers as
``grpo_tiny:KeyAnswer``), is the share of its tokens that are the key's answer. The
greedy evaluation decodes 8 tokens on held-out prompts (8 per key): a policy that
ignores the prompt, or emits one constant output, scores 1/8 there; the maximum is 1.

Why it is learnable in minutes: the trainer first teaches the model the answer format
(a few seconds of supervised steps on answers drawn *independently* of the prompt: the
model then emits one answer token, repeated, chosen regardless of the key, and scores
chance), so every group samples several answers and GRPO has a signal from the first
step; what is left to learn is one choice among 8 per key, which the model's last
layers pick up within tens of steps.

Each step: ``get_batch`` (whole groups), the batch's training view (prompt ids, each
output token with its rollout logprob and policy version, the stale mask), the GRPO
loss (group-normalised advantages, the PPO-clipped ratio against the rollout's
logprobs, tokens outside ``loss_mask`` or under the stale mask left out), one optimizer
step, the weights saved to ``CHECKPOINTS/vNNNN``, every replica loads them
(``update_weights``), next batch. Run it where torch and transformers are (SGLang's
venv, with queue-rollout installed there) against a farm whose workflow is
``grpo_tiny:KeyAnswer`` (its workers import this file: ``PYTHONPATH=examples``)::

    PYTHONPATH=examples queue-rollout up -c farm.toml        # the replicas' model: --model
    python examples/grpo_tiny.py -c farm.toml --model MODEL_DIR --steps 100 --json out.json

``--trainer none`` runs the same loop without torch (nothing is learned; the plumbing
is checked: shapes, masks, versions), as the fast tests do on simulated replicas.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from queue_rollout import RolloutClient
from queue_rollout.client.training import TrainingBatch
from queue_rollout.config import load_config

KEYS = list(range(200, 208))  # key k's answer is ANSWERS[k]
ANSWERS = list(range(100, 108))
NOISE = (400, 2048)  # noise tokens are drawn from this range of ids
ANSWER_TOKENS = 8  # tokens an episode generates, and the greedy evaluation
#: a training member's length: ANSWER_TOKENS, or LONG_TOKENS with this probability (the
#: long tail: most groups hold a member that runs several steps' time)
LONG_TOKENS, LONG_SHARE = 64, 0.25


# -- the task and the farm's workflow (no torch) ------------------------------------------

def task_prompts(n: int, seed: int, prefix: str, group_size: int = 0) -> list[dict[str, Any]]:
    """*n* prompts, the keys in turn (balanced), the noise from *seed*; with a
    *group_size*, each member's length (``lengths``: long-tailed)."""
    rng = random.Random(seed)
    prompts: list[dict[str, Any]] = []
    for i in range(n):
        prompt = {"id": f"{prefix}-{i:05d}",
                  "input_ids": [rng.randrange(*NOISE) for _ in range(3)] + [KEYS[i % len(KEYS)]],
                  "target": i % len(KEYS)}
        if group_size:
            prompt["lengths"] = [LONG_TOKENS if rng.random() < LONG_SHARE else ANSWER_TOKENS
                                 for _ in range(group_size)]
        prompts.append(prompt)
    return prompts


def score(output_ids: Iterable[int], target: int) -> float:
    """The share of *output_ids* that are the answer to key *target*."""
    out = list(output_ids)
    return sum(t == ANSWERS[target] for t in out) / len(out) if out else 0.0


class KeyAnswer:
    """The farm's workflow: member m generates ``lengths[m]`` tokens (ANSWER_TOKENS
    without ``lengths``); the reward is their score."""

    prompt_fields = ("target",)

    @staticmethod
    def check_prompt(prompt: dict[str, Any], config: Any) -> str | None:
        target = prompt["target"]
        if not (isinstance(target, int) and 0 <= target < len(KEYS)):
            return f"`target` must be an int in [0, {len(KEYS)})"
        lengths = prompt.get("lengths", [ANSWER_TOKENS] * config.rollout.group_size)
        if not (isinstance(lengths, list) and len(lengths) == config.rollout.group_size
                and all(isinstance(n, int) and n > 0 for n in lengths)):
            return "`lengths` must be rollout.group_size ints > 0"
        return None

    def __init__(self, config: object) -> None:
        self.config = config

    def run(self, ctx: Any) -> float:
        n = ctx.prompt.get("lengths", [ANSWER_TOKENS] * (ctx.member + 1))[ctx.member]
        gen = ctx.generate(max_new_tokens=n, ignore_eos=True)
        return score(gen.output_ids, ctx.prompt["target"])


# -- checks on what the farm delivered (no torch) ------------------------------------------

def check_view(view: TrainingBatch, group_size: int) -> None:
    """What every step relies on; AssertionError otherwise."""
    groups = view.groups()
    assert all(len(g) == group_size for g in groups), "a group is not whole"
    for s in view.samples:
        n = len(s.input_ids)
        assert len(s.loss_mask) == len(s.logprobs) == len(s.versions) == len(s.stale_mask) == n
        produced = [i for i, x in enumerate(s.loss_mask) if x]
        assert produced == list(range(s.prompt_len, n)), "single-turn: the output follows"
        assert all(s.versions[i] == -1 and not s.stale_mask[i] for i in range(s.prompt_len))
        assert all(s.versions[i] >= 0 for i in produced)
        assert all(s.stale_mask[i] == int(view.version - s.versions[i] > view.max_staleness)
                   for i in produced)


# -- the trainer --------------------------------------------------------------------------

class Trainer(Protocol):
    def warm_start(self, steps: int, seed: int) -> float: ...
    def step(self, view: TrainingBatch) -> dict[str, float]: ...
    def step_on(self, t: dict[str, Any]) -> dict[str, float]: ...
    def save(self, path: Path) -> Path: ...
    def evaluate(self, prompts: list[dict[str, Any]]) -> float | None: ...
    def probe(self, prompts: list[dict[str, Any]]) -> Any: ...
    def answer_logp(self, probe: Any) -> Any: ...
    def movement(self, before: Any, probe: Any) -> tuple[float, Any]: ...


class NoTrainer:
    """The loop's plumbing without torch: trains nothing, saves a marker folder."""

    def warm_start(self, steps: int, seed: int) -> float:
        return math.nan

    def step(self, view: TrainingBatch) -> dict[str, float]:
        return {"loss": math.nan, "tokens": float(sum(map(sum, (s.loss_mask for s in
                                                               view.samples))))}

    def step_on(self, t: dict[str, Any]) -> dict[str, float]:
        return {"loss": math.nan, "tokens": float(t["loss_mask"].sum())}

    def save(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / "NOT_WEIGHTS").write_text("no trainer: nothing was learned\n")
        return path

    def evaluate(self, prompts: list[dict[str, Any]]) -> float | None:
        return None

    def probe(self, prompts: list[dict[str, Any]]) -> Any:
        return None

    def answer_logp(self, probe: Any) -> Any:
        return None

    def movement(self, before: Any, probe: Any) -> tuple[float, Any]:
        return math.nan, None


class TorchTrainer:
    """Plain PyTorch GRPO on the model in *model_dir* (float32 on the CPU)."""

    def __init__(self, model_dir: Path, *, lr: float, seed: int, clip: float = 0.2) -> None:
        import torch
        from transformers import Qwen2ForCausalLM

        self.torch = torch
        torch.manual_seed(seed)
        torch.set_num_threads(1)
        self.source = model_dir
        self.model = Qwen2ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        self.lr, self.clip = lr, clip
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)

    def warm_start(self, steps: int, seed: int) -> float:
        """Teach the answer format: after the prompt, one answer token repeated, drawn
        independently of the prompt (so the model learns no key's answer)."""
        torch = self.torch
        rng = random.Random(seed)
        optimizer = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        loss = torch.tensor(math.nan)
        for i in range(steps):
            rows = [p["input_ids"] + [rng.choice(ANSWERS)] * ANSWER_TOKENS
                    for p in task_prompts(32, seed * 100_003 + i, "warm")]
            x = torch.tensor(rows)
            logits = self.model(x).logits[:, 3:-1]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     x[:, 4:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return float(loss)

    def step(self, view: TrainingBatch) -> dict[str, float]:
        return self.step_on(view.tensors(pad_id=0))

    def step_on(self, t: dict[str, Any]) -> dict[str, float]:
        """One GRPO step on padded tensors, as :meth:`TrainingBatch.tensors` lays them out
        (``stale_mask`` may be absent: nothing masked beyond ``loss_mask``)."""
        torch = self.torch
        rewards = torch.nan_to_num(t["rewards"], nan=0.0)
        advantages = torch.zeros_like(rewards)
        for g in range(int(t["group_index"].max()) + 1):  # group-normalised
            rows = t["group_index"] == g
            r = rewards[rows]
            advantages[rows] = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
        logits = self.model(t["input_ids"], attention_mask=t["attention_mask"]).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(
            -1, t["input_ids"][:, 1:, None])[..., 0]
        mask = t["loss_mask"][:, 1:].float()
        if "stale_mask" in t:
            mask = mask * (1 - t["stale_mask"][:, 1:].float())
        ratio = torch.exp(logp - t["logprobs"][:, 1:])
        a = advantages[:, None]
        per_token = -torch.minimum(ratio * a, ratio.clamp(1 - self.clip, 1 + self.clip) * a)
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        kept = mask.bool()
        return {"loss": float(loss), "tokens": float(mask.sum()),
                "ratio_mean": float(ratio[kept].mean()) if kept.any() else math.nan}

    def sample(self, prompts: list[dict[str, Any]], group_size: int,
               temperature: float) -> dict[str, Any]:
        """Each prompt's group sampled from this model in this process, at *temperature*
        (member m generates ``lengths[m]`` tokens), as padded tensors laid out as
        :meth:`TrainingBatch.tensors` lays out a farm's batch: the arm without the farm."""
        torch = self.torch
        rows = [(g, p, p["lengths"][m]) for g, p in enumerate(prompts) for m in range(group_size)]
        x = torch.tensor([p["input_ids"] for _, p, _ in rows])
        width, steps = x.shape[1], max(n for _, _, n in rows)
        chosen = []
        with torch.no_grad():
            out = self.model(x, use_cache=True)
            for _ in range(steps):
                logp = torch.log_softmax(out.logits[:, -1].float() / temperature, -1)
                token = torch.multinomial(logp.exp(), 1)
                chosen.append(logp.gather(-1, token))
                x = torch.cat([x, token], 1)
                out = self.model(token, past_key_values=out.past_key_values, use_cache=True)
        produced = torch.arange(x.shape[1])[None, :] < torch.tensor(
            [width + n for _, _, n in rows])[:, None]
        loss_mask = produced.clone()
        loss_mask[:, :width] = False
        logprobs = torch.zeros(x.shape)
        logprobs[:, width:] = torch.cat(chosen, 1)
        outputs = [x[i, width:width + n].tolist() for i, (_, _, n) in enumerate(rows)]
        return {"input_ids": x * produced, "attention_mask": produced.long(),
                "loss_mask": loss_mask.long(), "logprobs": logprobs * loss_mask,
                "rewards": torch.tensor([score(o, p["target"]) for o, (_, p, _) in
                                         zip(outputs, rows, strict=True)]),
                "group_index": torch.tensor([g for g, _, _ in rows]), "outputs": outputs}

    def probe(self, prompts: list[dict[str, Any]]) -> Any:
        """The fixed sequences the policy's movement is measured on: *prompts* and this
        model's greedy answer to each, now."""
        torch = self.torch
        with torch.no_grad():
            x = torch.tensor([p["input_ids"] for p in prompts])
            for _ in range(ANSWER_TOKENS):
                x = torch.cat([x, self.model(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
        return x

    def answer_logp(self, probe: Any) -> Any:
        """The next-token log-probabilities at each answer position of *probe*."""
        with self.torch.no_grad():
            logits = self.model(probe).logits[:, -ANSWER_TOKENS - 1:-1].float()
        return self.torch.log_softmax(logits, -1)

    def movement(self, before: Any, probe: Any) -> tuple[float, Any]:
        """The mean per-token KL(before || now) over *probe*'s answer positions, and
        now's log-probabilities (the next call's *before*)."""
        now = self.answer_logp(probe)
        return float((before.exp() * (before - now)).sum(-1).mean()), now

    def save(self, path: Path) -> Path:
        self.model.save_pretrained(path, safe_serialization=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                     "generation_config.json"):
            if (self.source / name).exists() and not (path / name).exists():
                shutil.copy(self.source / name, path / name)
        return path

    def evaluate(self, prompts: list[dict[str, Any]]) -> float:
        """The mean score of greedy decoding on *prompts*."""
        torch = self.torch
        with torch.no_grad():
            x = torch.tensor([p["input_ids"] for p in prompts])
            for _ in range(ANSWER_TOKENS):
                x = torch.cat([x, self.model(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
        outs = x[:, -ANSWER_TOKENS:].tolist()
        return statistics.fmean(score(o, p["target"]) for o, p in zip(outs, prompts,
                                                                      strict=True))


def recompute(samples: list[dict[str, Any]], checkpoints: dict[int, Path],
              shift: int = 0) -> float:
    """The mean absolute difference, per produced token, between the rollout's logprob
    and the one the checkpoint of the token's version (plus *shift*: a wrong one)
    gives; tokens whose shifted checkpoint does not exist are left out."""
    import torch
    from transformers import Qwen2ForCausalLM

    diffs: list[float] = []
    by_version: dict[int, list[tuple[int, int]]] = {}
    for n, s in enumerate(samples):
        for i, v in enumerate(s["versions"]):
            if s["loss_mask"][i] and v + shift in checkpoints:
                by_version.setdefault(v + shift, []).append((n, i))
    for v, where in sorted(by_version.items()):
        model = Qwen2ForCausalLM.from_pretrained(checkpoints[v], torch_dtype=torch.float32)
        rows = sorted({n for n, _ in where})
        width = max(len(samples[n]["input_ids"]) for n in rows)
        x = torch.tensor([samples[n]["input_ids"] + [0] * (width - len(samples[n]["input_ids"]))
                          for n in rows])
        with torch.no_grad():
            logp = torch.log_softmax(model(x).logits.float(), -1)
        row_of = {n: j for j, n in enumerate(rows)}
        for n, i in where:
            got = float(logp[row_of[n], i - 1, samples[n]["input_ids"][i]])
            diffs.append(abs(got - samples[n]["logprobs"][i]))
    return statistics.fmean(diffs) if diffs else math.nan


def check_versions(report: dict[str, Any], samples: list[dict[str, Any]],
                   checkpoints: dict[int, Path]) -> None:
    """Into *report*: :func:`recompute` under each token's checkpoint
    (``logprob_diff``) and under the one after (``logprob_diff_wrong``)."""
    report["logprob_diff"] = recompute(samples, checkpoints)
    report["logprob_diff_wrong"] = recompute(samples, checkpoints, shift=1)
    print(f"logprob |rollout - recomputed| per token: {report['logprob_diff']:.4f} "
          f"(the checkpoint after: {report['logprob_diff_wrong']:.4f})", flush=True)


# -- the loop -----------------------------------------------------------------------------

def train(client: RolloutClient, trainer: Trainer, *, steps: int, root: Path,
          warm_start_steps: int, seed: int, eval_prompts: list[dict[str, Any]],
          timeout: float, warm_seed: int | None = None, train_pause: float = 0.0,
          overlap: bool = False, extra_prompts: int = 0, log: Any = sys.stdout
          ) -> dict[str, Any]:
    """Run *steps* GRPO steps through the farm; returns the report. The warm start
    draws from *warm_seed* (default: *seed*); each optimizer step is followed by
    *train_pause* seconds (a larger model's step); with *overlap* the farm generates
    while the trainer trains (asynchronous), else it is paused (synchronous).
    *extra_prompts* more prompts are submitted than the steps consume (a dataset larger
    than the run: which of them reach the trainer is the admission's choice)."""
    rollout = client.config.rollout
    report: dict[str, Any] = {"steps": [], "checkpoints": {}}
    # the start: the answer format, loaded by every replica as the first version
    warm_loss = trainer.warm_start(warm_start_steps, seed if warm_seed is None else warm_seed)
    version = client.version() + 1
    path = trainer.save(root / f"v{version:04d}")
    client.update_weights(str(path), version)
    report["checkpoints"][version] = str(path)
    report["eval_before"] = trainer.evaluate(eval_prompts)
    report["warm_start_loss"] = warm_loss
    print(f"warm start: loss {warm_loss:.3f}, v{version} loaded; greedy eval "
          f"{report['eval_before']}", file=log, flush=True)
    probe = trainer.probe(eval_prompts)
    before = trainer.answer_logp(probe)
    report["submitted"] = client.submit(task_prompts(
        steps * rollout.batch_size + extra_prompts, seed + 1, f"train-s{seed}",
        rollout.group_size))
    submitted = time.monotonic()
    samples: list[dict[str, Any]] = []
    for step in range(1, steps + 1):
        t0 = time.monotonic()
        batch = client.get_batch(timeout=timeout)
        waited = time.monotonic() - t0
        got_s = time.monotonic() - submitted
        times: dict[str, float] = {}
        view_version = client.version()
        view = batch.training_view(view_version, rollout.max_staleness)
        check_view(view, rollout.group_size)

        def learn(_batch: Any, view: TrainingBatch = view,
                  times: dict[str, float] = times) -> dict[str, float]:
            t = time.monotonic()
            out = trainer.step(view)
            time.sleep(train_pause)
            times["train_s"] = time.monotonic() - t
            return out

        def publish(new: int, times: dict[str, float] = times) -> str:
            t = time.monotonic()
            saved = trainer.save(root / f"v{new:04d}")
            times["save_s"] = time.monotonic() - t
            report["checkpoints"][new] = str(saved)
            return str(saved)

        t1 = time.monotonic()
        # pause (unless overlapping) .. train .. load .. resume
        stats = client.train_step(batch, learn, weights=publish, pause=not overlap)
        spent = time.monotonic() - t1
        kl, before = trainer.movement(before, probe)
        rewards = [s.reward for s in view.samples if s.reward is not None]
        spanning = sum(len({v for v in s.versions if v >= 0}) > 1 for s in view.samples)
        row = {"step": step, "version": client.version(), "batch": batch.id,
               "groups": [g.id for g in batch.groups],
               "group_rewards": [statistics.fmean(m.reward or 0.0 for m in g.members)
                                 for g in batch.groups],
               "reward": statistics.fmean(rewards) if rewards else math.nan,
               "wait_s": waited, "train_s": times["train_s"], "save_s": times["save_s"],
               "update_s": spent - times["train_s"] - times["save_s"],
               "staleness": [view_version - g.version for g in batch.groups],
               "episodes": len(view.samples), "spanning": spanning,
               "produced": sum(sum(s.loss_mask) for s in view.samples),
               "masked": sum(sum(s.stale_mask) for s in view.samples), "kl": kl,
               "got_s": got_s, "at_s": time.monotonic() - submitted, **stats}
        report["steps"].append(row)
        samples += [{"input_ids": s.input_ids, "loss_mask": s.loss_mask,
                     "logprobs": s.logprobs, "versions": s.versions} for s in view.samples]
        print(f"step {step}: v{row['version']} reward {row['reward']:.3f} wait "
              f"{waited:.2f}s train {row['train_s']:.2f}s save {row['save_s']:.2f}s update "
              f"{row['update_s']:.2f}s spanning {spanning}/{len(view.samples)} masked "
              f"{row['masked']}/{row['produced']}", file=log, flush=True)
    report["eval_after"] = trainer.evaluate(eval_prompts)
    report["samples"] = samples
    print(f"greedy eval on {len(eval_prompts)} held-out prompts: {report['eval_before']} "
          f"-> {report['eval_after']}", file=log, flush=True)
    return report


def train_local(trainer: TorchTrainer, group_size: int, batch_size: int, temperature: float,
                *, steps: int, warm_start_steps: int, warm_seed: int, seed: int,
                eval_prompts: list[dict[str, Any]], log: Any = sys.stdout) -> dict[str, Any]:
    """The same loop without the farm: each step's groups sampled from the trainer's own
    model in this process (on-policy, nothing stale); returns the report."""
    report: dict[str, Any] = {"steps": [], "warm_start_loss": trainer.warm_start(
        warm_start_steps, warm_seed), "eval_before": trainer.evaluate(eval_prompts)}
    probe = trainer.probe(eval_prompts)
    before = trainer.answer_logp(probe)
    prompts = task_prompts(steps * batch_size, seed + 1, f"train-s{seed}", group_size)
    for step in range(1, steps + 1):
        t0 = time.monotonic()
        t = trainer.sample(prompts[(step - 1) * batch_size:step * batch_size], group_size,
                           temperature)
        t1 = time.monotonic()
        stats = trainer.step_on(t)
        kl, before = trainer.movement(before, probe)
        row = {"step": step, "reward": float(t["rewards"].mean()), "wait_s": t1 - t0,
               "train_s": time.monotonic() - t1, "kl": kl, **stats}
        report["steps"].append(row)
        print(f"step {step}: reward {row['reward']:.3f} sample {row['wait_s']:.2f}s train "
              f"{row['train_s']:.2f}s kl {kl:.2e}", file=log, flush=True)
    report["eval_after"] = trainer.evaluate(eval_prompts)
    print(f"greedy eval on {len(eval_prompts)} held-out prompts: {report['eval_before']} "
          f"-> {report['eval_after']}", file=log, flush=True)
    return report


def run_options(parser: argparse.ArgumentParser) -> None:
    """The options a run of the task takes, with this trainer or TRL's."""
    parser.add_argument("--steps", type=int, default=100, help="GRPO steps (default 100)")
    parser.add_argument("--lr", type=float, default=5e-4,
                        help="Adam's step size (default 5e-4)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the run's seed: the training prompts (their noise and lengths) "
                             "and, in process, the sampling generator")
    parser.add_argument("--warm-start-seed", type=int, default=None,
                        help="the warm start's seed (default: --seed); a study over seeds "
                             "keeps one warm start")
    parser.add_argument("--sampler", choices=("farm", "local"), default="farm",
                        help="farm (default): the rollouts through the farm; local: sampled "
                             "from the trainer's own model in this process, the farm's "
                             "config read for the group and batch sizes and the temperature")
    parser.add_argument("--warm-start-steps", type=int, default=100,
                        help="supervised steps teaching the answer format (default 100)")
    parser.add_argument("--eval-prompts", type=int, default=64,
                        help="held-out prompts for the greedy evaluation (default 64)")
    parser.add_argument("--checkpoints", type=Path, help="where weights go (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a batch")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--check-versions", action="store_true",
                        help="after the run, recompute each produced token's logprob under "
                             "the checkpoint its version names, and under the one after")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="the farm's TOML config")
    parser.add_argument("--model", type=Path, help="the replicas' model folder (the start)")
    parser.add_argument("--trainer", choices=("torch", "none"), default="torch",
                        help="torch (default), or none: the plumbing only")
    run_options(parser)
    parser.add_argument("--train-pause", type=float, default=0.0,
                        help="seconds added to each optimizer step (a larger model's step)")
    parser.add_argument("--overlap", action="store_true",
                        help="train while the farm generates the next batch (asynchronous; "
                             "default: the farm pauses while the trainer trains)")
    parser.add_argument("--extra-prompts", type=int, default=0,
                        help="submit this many prompts more than the steps consume")
    args = parser.parse_args(argv)
    if args.trainer == "torch" and args.model is None:
        parser.error("--model is needed with --trainer torch")
    if args.sampler == "local" and (args.trainer != "torch" or args.check_versions
                                    or args.overlap or args.train_pause or args.extra_prompts):
        parser.error("--sampler local trains with torch, synchronously, and has no "
                     "versions to check")
    warm_seed = args.seed if args.warm_start_seed is None else args.warm_start_seed
    eval_prompts = task_prompts(args.eval_prompts, 10_000 + warm_seed, "eval")
    started = time.monotonic()
    if args.sampler == "local":
        config = load_config(args.config)
        report = train_local(TorchTrainer(args.model, lr=args.lr, seed=args.seed),
                             config.rollout.group_size, config.rollout.batch_size,
                             config.workflow.sampling.temperature, steps=args.steps,
                             warm_start_steps=args.warm_start_steps, warm_seed=warm_seed,
                             seed=args.seed, eval_prompts=eval_prompts)
        report.update(wall_s=time.monotonic() - started, admission="local", seed=args.seed)
        if args.json:
            args.json.write_text(json.dumps(report))
        return 0
    client = RolloutClient.from_config(args.config, consumer=f"grpo-tiny-{args.seed}")
    root = args.checkpoints or Path(tempfile.mkdtemp(prefix="grpo-tiny-"))
    trainer: Trainer = (TorchTrainer(args.model, lr=args.lr, seed=args.seed)
                        if args.trainer == "torch" else NoTrainer())
    report = train(client, trainer, steps=args.steps, root=root,
                   warm_start_steps=args.warm_start_steps, seed=args.seed,
                   eval_prompts=eval_prompts, timeout=args.timeout, warm_seed=warm_seed,
                   train_pause=args.train_pause, overlap=args.overlap,
                   extra_prompts=args.extra_prompts)
    report["wall_s"] = time.monotonic() - started
    report["admission"] = client.config.rollout.mode
    report["seed"] = args.seed
    if args.check_versions:
        check_versions(report, report["samples"],
                       {int(v): Path(p) for v, p in report["checkpoints"].items()})
    if args.json:
        args.json.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
