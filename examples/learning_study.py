"""Learning over seeds: the key-to-answer task of ``grpo_tiny.py`` run again and again,
each arm with each seed, one JSON line per run, resumable.

Arms, for learning over seeds: ``trl-farm`` (TRL's GRPOTrainer, its rollouts through
the farm, sample refill), ``trl-local`` (the same, its rollouts sampled in process),
``grpo-farm`` (this project's GRPO loop through the farm, sample refill) and
``grpo-local`` (the same loop sampling from its own model); for time to reward,
``grpo_tiny.py`` through the farm with ``--train-pause`` seconds added to each optimizer
step: ``sync`` (group admission, ``max_staleness`` 0, the farm paused while the trainer
trains), ``async-group`` and ``async-refill`` (``max_staleness`` 1, training while the
farm generates, each admission mode). Every run keeps one warm start (seed 0) and one
held-out evaluation set; the seed sets the training prompts (their noise and long-tail lengths)
and the sampling: in process its generator, through the farm ``workflow.seed`` (which
SGLang on CPU ignores: the farm's samples differ run to run anyway).

A farm arm's run gets a farm of its own (``queue-rollout up`` on a private Redis this
script starts, a new farm name) on the SGLang replicas given, started before it and
stopped after: a run that fails leaves nothing behind for the next. Each line holds the
run's sampled reward and policy movement (mean per-token KL between consecutive steps
on the held-out prompts) per step, its take-off step (the first whose reward averaged
over 5 steps reaches 0.5; null: not within the run) and its greedy evaluation. A run
already in the file is skipped; the runs go seed by seed, the arms alternating. A file
``STOP`` in the work folder stops the study before its next run (the one running ends
first); started again, it goes on where it stopped.

Run it in SGLang's venv (torch and TRL, this checkout installed there) with two
replicas of the tiny model serving (``tests/real_engine/server.py``)::

    PYTHONPATH=examples python examples/learning_study.py --replicas URL0,URL1 \\
        --model MODEL_DIR --arms trl-farm,trl-local --seeds 0-15 --steps 80 --out runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from learning_stats import take_off

from queue_rollout.config import Config, write_config
from queue_rollout.ledger.embedded import EmbeddedRedis, free_port
from queue_rollout.procs import cli_exe

HERE = Path(__file__).resolve().parent
G, B, MAX_STALENESS, SLOTS = 16, 4, 1, 8


@dataclass(frozen=True)
class Arm:
    script: str
    sampler: str = "farm"  # or local: in process
    mode: str = "sample"  # the farm's admission
    max_staleness: int = MAX_STALENESS
    overlap: bool = False  # train while the farm generates (grpo_tiny.py only)


ARMS = {
    # learning over seeds: through the farm (refill) against in process
    "trl-farm": Arm("trl_grpo_tiny.py"), "trl-local": Arm("trl_grpo_tiny.py", "local"),
    "grpo-farm": Arm("grpo_tiny.py"), "grpo-local": Arm("grpo_tiny.py", "local"),
    # time to reward: synchronous, and asynchronous with each admission mode
    "sync": Arm("grpo_tiny.py", mode="group", max_staleness=0),
    "async-group": Arm("grpo_tiny.py", mode="group", overlap=True),
    "async-refill": Arm("grpo_tiny.py", mode="sample", overlap=True),
}


def seeds(text: str) -> list[int]:
    """``0-15`` or ``0,3,5``: the seeds."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def farm_toml(path: Path, name: str, redis_url: str, urls: list[str], seed: int,
              mode: str = "sample", max_staleness: int = MAX_STALENESS) -> Path:
    """The study's farm: groups of G, batches of B, two groups' slots (refill: less one
    member), ``pause_mode = "abort"``, the ``grpo_tiny:KeyAnswer`` workflow."""
    admission = ({"max_concurrent_samples": 2 * G - 1} if mode == "sample"
                 else {"max_concurrent_rollouts": 2})
    config = msgspec.convert({
        "farm": {"name": name, "redis_url": redis_url, "state_dir": str(path.parent / "state")},
        "rollout": {"group_size": G, "batch_size": B, "max_staleness": max_staleness,
                    **admission},
        "timeouts": {"lease": 10, "shutdown_grace": 2},
        "workflow": {"name": "grpo_tiny:KeyAnswer", "seed": seed},
        "engine": {"kind": "sglang", "urls": urls, "slots_per_replica": SLOTS,
                   "threads_per_process": 2, "pause_mode": "abort", "deterministic": False},
        "metrics": {"port": free_port()}}, Config)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_config(path, config)
    return path


@contextmanager
def farm_up(toml: Path, log: Path) -> Iterator[None]:
    """``queue-rollout up -c toml`` while the block runs; Ctrl-C'd after."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with log.open("ab") as err:
        proc = subprocess.Popen([cli_exe(), "up", "-c", str(toml)], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env, cwd=toml.parent)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if " up" not in line:
            raise RuntimeError(f"`up` did not start: {line!r}; see {log}")
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summary(arm: str, seed: int, report: dict[str, Any], train_pause: float
            ) -> dict[str, Any]:
    """One run's JSON line from its trainer's report."""
    steps = report["steps"]
    rewards = [s["reward"] for s in steps]
    return {"arm": arm, "seed": seed, "steps": len(rewards), "take_off": take_off(rewards),
            "eval_before": report["eval_before"], "eval_after": report["eval_after"],
            "train_pause_s": train_pause, "wall_s": round(report["wall_s"], 1),
            "rewards": [round(r, 4) for r in rewards], "kl": [s["kl"] for s in steps],
            "wait_s": [round(s["wait_s"], 3) for s in steps],
            "at_s": [round(s["at_s"], 3) for s in steps if "at_s" in s],
            "got_s": [round(s["got_s"], 3) for s in steps if "got_s" in s],
            # which prompts reached the trainer, in what order, with what reward
            "submitted": report.get("submitted"),
            "groups": [s["groups"] for s in steps if "groups" in s],
            "group_rewards": [[round(r, 4) for r in s["group_rewards"]] for s in steps
                              if "group_rewards" in s]}


def run_one(arm: str, seed: int, args: argparse.Namespace, redis: EmbeddedRedis | None
            ) -> dict[str, Any]:
    spec = ARMS[arm]
    work = args.workdir / f"{arm}-s{seed}-{time.time_ns()}"
    toml = farm_toml(work / "farm.toml", f"study-{work.name}",
                     redis.url if redis else "redis://127.0.0.1:1/0", args.replicas, seed,
                     spec.mode, spec.max_staleness)
    report_path = work / "report.json"
    command = [sys.executable, str(HERE / spec.script), "-c", str(toml), "--model",
               str(args.model), "--steps", str(args.steps), "--seed", str(seed),
               "--warm-start-seed", "0", "--sampler", spec.sampler, "--checkpoints",
               str(work / "ckpt"), "--json", str(report_path)]
    if spec.script == "grpo_tiny.py" and spec.sampler == "farm":
        command += ["--train-pause", str(args.train_pause), "--extra-prompts",
                    str(args.extra_prompts), *(["--overlap"] if spec.overlap else [])]
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    with (work / "trainer.log").open("wb") as log:
        if spec.sampler == "farm":
            with farm_up(toml, work / "up.log"):
                subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               cwd=work, check=True)
        else:
            subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                           check=True)
    return summary(arm, seed, json.loads(report_path.read_text()), args.train_pause)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="",
                        help="the SGLang replicas' URLs, comma-separated (farm arms)")
    parser.add_argument("--model", type=Path, required=True, help="the replicas' model folder")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated, of {', '.join(ARMS)} (default: all)")
    parser.add_argument("--seeds", type=seeds, default=seeds("0-7"), help="e.g. 0-15 or 0,3")
    parser.add_argument("--steps", type=int, default=80, help="steps per run (default 80)")
    parser.add_argument("--train-pause", type=float, default=0.0,
                        help="grpo_tiny.py through the farm: seconds added to each optimizer "
                             "step (default 0)")
    parser.add_argument("--extra-prompts", type=int, default=0,
                        help="grpo_tiny.py through the farm: prompts submitted beyond what "
                             "the steps consume (default 0)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON Lines file")
    parser.add_argument("--workdir", type=Path, default=Path("study-runs"),
                        help="each run's farm, checkpoints and logs (default ./study-runs)")
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    if unknown := [a for a in arms if a not in ARMS]:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    args.replicas = [u for u in args.replicas.split(",") if u]
    farm_arms = [a for a in arms if ARMS[a].sampler == "farm"]
    if farm_arms and not args.replicas:
        parser.error(f"{', '.join(farm_arms)} need --replicas")
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.out.exists():
        done = {(r["arm"], r["seed"]) for r in map(json.loads, args.out.read_text().splitlines())
                if r.get("steps") == args.steps and r.get("train_pause_s") == args.train_pause}
    todo = [(a, s) for s in args.seeds for a in arms if (a, s) not in done]
    print(f"{len(done)} run(s) in {args.out}; {len(todo)} to go", flush=True)
    redis = EmbeddedRedis(args.workdir / "redis", write_url=False) if farm_arms else None
    if redis is not None:
        redis.start()
    try:
        for n, (arm, seed) in enumerate(todo, 1):
            if (args.workdir / "STOP").exists():
                print(f"{args.workdir / 'STOP'} found: stopped before {arm} seed {seed}",
                      flush=True)
                break
            started = time.monotonic()
            line = run_one(arm, seed, args, redis)
            with args.out.open("a") as f:
                f.write(json.dumps(line) + "\n")
                f.flush()
                os.fsync(f.fileno())
            print(f"[{n}/{len(todo)}] {arm} seed {seed}: take-off {line['take_off']}, greedy "
                  f"eval {line['eval_before']:.3f} -> {line['eval_after']:.3f} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        if redis is not None:
            redis.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
