"""A trainer loop against a queue-rollout farm.

Start a farm, then run the loop against the same config:

    queue-rollout up -c farm.toml                       # another terminal (or `node` + `collector`)
    python examples/trainer_loop.py -c farm.toml --steps 4 --prompts prompts.jsonl

Each step takes one batch of B whole groups and hands it to ``client.train_step``:
generation pauses (a barrier: every live worker has paused its replica), the step masks
tokens too stale to train on and "trains" (here: a stand-in that computes a number
from the batch), the batch is acknowledged, and the new policy is published: every
``--push-every`` steps a checkpoint is saved and every replica loads it
(``update_weights``), on the other steps only the version is raised; then generation
resumes. Without ``--prompts`` the loop submits a small long-tail set of its own.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from queue_rollout import RolloutClient


def example_prompts(n: int, group_size: int) -> list[dict]:
    """n prompts; per group one long member (its position rotating) and short others."""
    return [{"id": f"example-{int(time.time())}-{i:04d}", "prompt": f"example prompt {i}",
             "member_lengths": [256 if m == i % group_size else 32 for m in range(group_size)]}
            for i in range(n)]


def train_step(batch, mask: list[list[list[bool]]]) -> float:
    """The trainer's own work; here a stand-in: the mean reward-weighted kept-token count."""
    kept = [sum(tokens) for group in mask for tokens in group]
    rewards = [m.reward or 0.0 for g in batch.groups for m in g.members]
    return sum(k * (1.0 + r) for k, r in zip(kept, rewards, strict=True)) / max(1, len(kept))


def save_checkpoint(step: int, root: Path) -> Path:
    """Stand-in for writing the trained weights where every replica can read them."""
    path = root / f"step-{step:05d}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "weights.txt").write_text(f"policy after step {step}\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="the farm's TOML config")
    parser.add_argument("--steps", type=int, default=4, help="training steps (batches)")
    parser.add_argument("--prompts", help="JSON Lines prompt file (default: a small set)")
    parser.add_argument("--push-every", type=int, default=2,
                        help="load new weights into the replicas every N steps (default 2)")
    parser.add_argument("--checkpoints", help="where checkpoints go (default: a temp dir)")
    args = parser.parse_args(argv)

    client = RolloutClient.from_config(args.config, consumer="example-trainer")
    rollout = client.config.rollout
    if args.prompts:
        prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines()
                   if line.strip()]
    else:
        prompts = example_prompts(args.steps * rollout.batch_size, rollout.group_size)
    print(f"submitted {client.submit(prompts)} prompts", flush=True)
    root = Path(args.checkpoints or tempfile.mkdtemp(prefix="qr-example-ckpt-"))

    for step in range(1, args.steps + 1):
        batch = client.get_batch(timeout=600)
        push = step % args.push_every == 0

        def train(batch):  # generation is paused in place while it runs
            return train_step(batch, batch.stale_token_mask(client.version(),
                                                            rollout.max_staleness))

        def publish(version: int, step: int = step) -> str:  # where the replicas load from
            return str(save_checkpoint(step, root))

        # pause barrier -> train -> ack -> version + 1 (loading the checkpoint) -> resume
        loss = client.train_step(batch, train, weights=publish if push else None)
        how = f"weights step-{step:05d} loaded" if push else "version raised"
        print(f"step {step}: batch {batch.id[:8]} of {len(batch.groups)} groups (delivered "
              f"under v{batch.version}), loss {loss:.2f}; {how}; now v{client.version()}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
