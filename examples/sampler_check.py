"""At fixed weights, does the farm sample from the policy the trainer holds?

The key-to-answer task of ``grpo_tiny.py``: its warm start (the answer format, the same
seed every run) gives the weights, every replica loads them, and then nothing trains.
For each of the 8 keys one prompt is sampled ``--samples`` times (8 tokens each) in
groups of ``rollout.group_size``, through the farm and, from the same weights, in this
process (the trainer's float32 model, at the temperature the trainer assumes). Per key:

- the answers (the 8 generated tokens) of the two samplers, two-sample chi-squared
  (answers expected fewer than 5 times pooled);
- per sample, the mean over its tokens of log pi(y_t) + H_t, both from the trainer's
  model at the assumed temperature (H_t the entropy of the next-token distribution):
  its expectation is 0 for a sampler that follows that policy; its mean over the
  samples and the standard error;
- the intra-group correlation of the rewards (one-way ICC over the groups):
  members of a group should be drawn independently.

Over every key, per sampler: the mean of the keys' log pi + H means, and the ICC of
the rewards less their key's mean with a 99% bootstrap interval. A sampler is flagged
where that mean is more than 4 standard errors from 0 or that interval lies above 0;
the farm also where a key's chi-squared p-value is below 0.001/8. The positive control
runs the farm at ``workflow.sampling.temperature = 0.9`` while the trainer assumes 1.0
(``--assume-temperature 1.0``): it must be flagged.

Run it in SGLang's venv (torch) against a farm whose workflow is
``grpo_tiny:KeyAnswer`` (``PYTHONPATH=examples``)::

    python examples/sampler_check.py -c farm.toml --model MODEL_DIR --samples 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_tiny import ANSWER_TOKENS, KEYS, TorchTrainer, score, task_prompts
from learning_stats import chi2_two_sample, icc, icc_interval, mean_se

from queue_rollout import RolloutClient

#: a sample: (output token ids, reward)
Draw = tuple[list[int], float]
CHI2_ALPHA = 0.001  # over the 8 keys (Bonferroni)
Z_LIMIT = 4.0  # standard errors of the keys' mean log pi + H from 0


def key_prompts(seed: int) -> list[dict[str, Any]]:
    """One prompt per key (the noise from *seed*)."""
    return task_prompts(len(KEYS), seed, "check")


def farm_draws(client: RolloutClient, prompts: list[dict[str, Any]], per_key: int,
               timeout: float, log: Any) -> dict[int, list[list[Draw]]]:
    """Per key, its groups of draws through the farm; each batch acknowledged and the
    version raised (the weights unchanged) so that admission goes on."""
    rollout = client.config.rollout
    groups = per_key // rollout.group_size
    submitted = [{**p, "id": f"check-{time.time_ns()}-k{p['target']}-{j:04d}",
                  "lengths": [ANSWER_TOKENS] * rollout.group_size}
                 for j in range(groups) for p in prompts]
    client.submit(submitted)
    out: dict[int, list[list[Draw]]] = {p["target"]: [] for p in prompts}
    received, started = 0, time.monotonic()
    while received < len(submitted):
        batch = client.get_batch(timeout=timeout)
        for g in batch.groups:
            out[g.prompt["target"]].append(
                [(m.output_ids, score(m.output_ids, g.prompt["target"])) for m in g.members])
        received += len(batch.groups)
        client.train_step(batch, lambda b: None, pause=False)
        print(f"farm: {received}/{len(submitted)} groups, "
              f"{time.monotonic() - started:.0f}s", file=log, flush=True)
    return out


def local_draws(policy: TorchTrainer, prompts: list[dict[str, Any]], per_key: int,
                group_size: int, temperature: float, seed: int) -> dict[int, list[list[Draw]]]:
    """Per key, its groups of draws from *policy* in this process at *temperature*."""
    torch = policy.torch
    generator = torch.Generator().manual_seed(seed)
    out: dict[int, list[list[Draw]]] = {}
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([p["input_ids"]] * per_key)
            for _ in range(ANSWER_TOKENS):
                logits = policy.model(x).logits[:, -1].float() / temperature
                nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
                x = torch.cat([x, nxt], 1)
            outputs = x[:, -ANSWER_TOKENS:].tolist()
            draws = [(o, score(o, p["target"])) for o in outputs]
            out[p["target"]] = [draws[i:i + group_size] for i in range(0, per_key, group_size)]
    return out


def logp_plus_entropy(policy: TorchTrainer, prompt: list[int], outputs: list[list[int]],
                      temperature: float, chunk: int = 500) -> list[float]:
    """Per output, the mean over its tokens of log pi(y_t) + H_t under *policy* at
    *temperature*."""
    torch = policy.torch
    values: list[float] = []
    with torch.no_grad():
        for i in range(0, len(outputs), chunk):
            x = torch.tensor([prompt + o for o in outputs[i:i + chunk]])
            logp = torch.log_softmax(policy.model(x).logits.float() / temperature, -1)
            logp = logp[:, len(prompt) - 1:-1]  # the distributions the outputs came from
            chosen = logp.gather(-1, x[:, len(prompt):, None])[..., 0]
            entropy = -(logp.exp() * logp).sum(-1)
            values += (chosen + entropy).mean(-1).tolist()
    return values


def sampler_stats(policy: TorchTrainer, prompt: dict[str, Any], groups: list[list[Draw]],
                  temperature: float) -> dict[str, Any]:
    """One sampler's figures on one key."""
    outputs = [o for g in groups for o, _ in g]
    mean, se = mean_se(logp_plus_entropy(policy, prompt["input_ids"], outputs, temperature))
    rewards = [[r for _, r in g] for g in groups]
    return {"samples": len(outputs), "logp_plus_entropy": mean, "se": se,
            "z": mean / se if se else 0.0,
            "reward": statistics.fmean(r for g in rewards for r in g), "icc": icc(rewards)}


def pooled(rows: list[dict[str, Any]], draws: dict[int, list[list[Draw]]]) -> dict[str, Any]:
    """One sampler over every key: the mean of the keys' log pi + H means with its
    standard error; the ICC of the rewards less their key's mean, over every group, with
    a 99% bootstrap interval."""
    mean = statistics.fmean(r["logp_plus_entropy"] for r in rows)
    se = math.sqrt(sum(r["se"] ** 2 for r in rows)) / len(rows)
    centred = []
    for groups in draws.values():
        key_mean = statistics.fmean(r for g in groups for _, r in g)
        centred += [[r - key_mean for _, r in g] for g in groups]
    low, high = icc_interval(centred, rounds=2000, alpha=0.01)
    return {"logp_plus_entropy": mean, "se": se, "z": mean / se if se else 0.0,
            "icc": icc(centred), "icc_interval": [low, high]}


def compare(policy: TorchTrainer, prompts: list[dict[str, Any]],
            farm: dict[int, list[list[Draw]]], local: dict[int, list[list[Draw]]],
            temperature: float) -> dict[str, Any]:
    """Per key both samplers' figures and the chi-squared test between them; each
    sampler's figures over every key; and the flags of each."""
    keys = []
    for p in prompts:
        k = p["target"]
        test = chi2_two_sample([tuple(o) for g in farm[k] for o, _ in g],
                               [tuple(o) for g in local[k] for o, _ in g])
        keys.append({"key": k, "chi2": test.statistic, "df": test.df, "p": test.p_value,
                     "farm": sampler_stats(policy, p, farm[k], temperature),
                     "local": sampler_stats(policy, p, local[k], temperature)})
    overall = {side: pooled([row[side] for row in keys], draws)
               for side, draws in (("farm", farm), ("local", local))}

    def flags(side: str) -> list[str]:
        s, out = overall[side], []
        if abs(s["z"]) > Z_LIMIT:
            out.append(f"log pi + H {s['logp_plus_entropy']:+.4f} ({s['z']:+.1f} SE)")
        if s["icc_interval"][0] > 0:
            out.append(f"rewards correlated within groups (ICC {s['icc']:+.3f}, 99% "
                       f"interval from {s['icc_interval'][0]:+.3f})")
        return out

    chi2 = [f"key {r['key']}: answers differ from the trainer's (chi-squared p "
            f"{r['p']:.2g})" for r in keys if r["p"] < CHI2_ALPHA / len(keys)]
    return {"keys": keys, "overall": overall,
            "flags": {"farm": flags("farm") + chi2, "local": flags("local")}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="the farm's TOML config")
    parser.add_argument("--model", type=Path, required=True, help="the replicas' model folder")
    parser.add_argument("--samples", type=int, default=2000,
                        help="samples per key on each side (a multiple of the group size; "
                             "default 2000)")
    parser.add_argument("--assume-temperature", type=float, default=None,
                        help="the temperature the trainer assumes (default: the farm's)")
    parser.add_argument("--seed", type=int, default=0, help="the local sampler's seed")
    parser.add_argument("--warm-start-steps", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for a batch")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    client = RolloutClient.from_config(args.config, consumer="sampler-check")
    rollout, sampling = client.config.rollout, client.config.workflow.sampling
    if args.samples <= 0 or args.samples % rollout.group_size:
        parser.error(f"--samples must be a positive multiple of rollout.group_size "
                     f"({rollout.group_size})")
    if sampling.top_p != 1.0 or sampling.top_k not in (None, -1):
        parser.error("the farm must sample the whole distribution (top_p 1, no top_k)")
    assumed = sampling.temperature if args.assume_temperature is None else args.assume_temperature
    started = time.monotonic()
    policy = TorchTrainer(args.model, lr=0.0, seed=0)
    policy.warm_start(args.warm_start_steps, 0)
    root = Path(tempfile.mkdtemp(prefix="sampler-check-"))
    version = client.version() + 1
    client.update_weights(str(policy.save(root / f"v{version:04d}")), version)
    prompts = key_prompts(1)
    farm = farm_draws(client, prompts, args.samples, args.timeout, sys.stderr)
    farm_s = time.monotonic() - started
    local = local_draws(policy, prompts, args.samples, rollout.group_size, assumed, args.seed)
    report = {"farm_temperature": sampling.temperature, "assumed_temperature": assumed,
              "samples_per_key": args.samples, "group_size": rollout.group_size,
              "admission": rollout.mode, "farm_s": farm_s,
              **compare(policy, prompts, farm, local, assumed)}
    report["wall_s"] = time.monotonic() - started
    for row in report["keys"]:
        f, loc = row["farm"], row["local"]
        print(f"key {row['key']}: chi2 {row['chi2']:.1f} (df {row['df']}, p {row['p']:.3g}); "
              f"log pi + H farm {f['logp_plus_entropy']:+.4f} ({f['z']:+.1f} SE), local "
              f"{loc['logp_plus_entropy']:+.4f} ({loc['z']:+.1f} SE); ICC farm {f['icc']:+.3f}, "
              f"local {loc['icc']:+.3f}", flush=True)
    for side, s in report["overall"].items():
        print(f"{side}, every key: log pi + H {s['logp_plus_entropy']:+.4f} ({s['z']:+.1f} SE); "
              f"ICC {s['icc']:+.3f} (99%: {s['icc_interval'][0]:+.3f} to "
              f"{s['icc_interval'][1]:+.3f})", flush=True)
    for side in ("farm", "local"):
        flagged = report["flags"][side]
        print(f"{side}: " + ("flagged: " + "; ".join(flagged) if flagged else "not flagged"),
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
