"""``queue-rollout bench``: its options and what runs them. The command line registers
the command and hands it here; each profile's runner is imported when it is run."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from queue_rollout.argtypes import fraction, non_negative, positive
from queue_rollout.config import Config
from queue_rollout.errors import ConfigError

HELP = "benchmarks: the pilots through the real stack, the control plane, the ledger"

#: Each bench profile with about how long it ran on this project's 2-core machine.
BENCH_PROFILES = {
    "long-tail": "2 min", "equal": "1.5 min", "group-between": "1.5 min",
    "mixed-tail": "1.5 min", "control-plane": "1 min", "ledger": "30 s",
    "calibration": "30 s", "gpu-h200": "2 min", "swe-agentic": "8.5 min",
    "boba-math": "3.5 min",
    "boba-math-b8": "3.5 min", "long-prompt": "3.5 min", "kv-pressure": "5.5 min",
    "all": "30 min (every profile above)", "sim-replica": "1 min",
    "redis-load": "2 min", "real-sglang": "14 min (needs SGLang and --model)",
    "real-sglang-kv": "10 min (needs SGLang and --model)",
    "real-vllm": "6 min (needs vLLM and an untied --model)",
    "peer-areal": "16 min (needs AReaL, SGLang and --model; --small: 1.5 min, AReaL only)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench's options on its subcommand's parser *p*."""
    p.add_argument("--profile", default=None, choices=list(BENCH_PROFILES),
                   help="pilots (long-tail, equal, group-between, mixed-tail; the seed's "
                        "workloads swe-agentic, boba-math, boba-math-b8, each at its own "
                        "shape and scale): both admission modes through the real stack "
                        "beside their ideal schedules; long-prompt: both modes with "
                        "rollout.placement any and group, prefill computed and cached per "
                        "group; kv-pressure: both modes with fixed and adaptive slots on "
                        "replicas short of KV memory; control-plane: no-op "
                        "episodes vs plain RQ; ledger: script ops/s vs the trivial-script "
                        "floor; calibration: the engine model's ideal schedules of "
                        "long-tail and equal under each pause mode beside the reference's "
                        "figures; gpu-h200: the same pilots at the seed's shape, and the "
                        "seed's workloads, predicted from an H200's step times, beside the "
                        "seed's figures; all: every "
                        "one of these (without --profile: the list, "
                        "with how long each takes); sim-replica: CPU of one simulated "
                        "replica serving --requests in a closed loop; "
                        "redis-load: what a farm of --gpus costs Redis, idle, per episode "
                        "and per running episode; real-sglang: both modes on two real SGLang "
                        "replicas on this machine's CPU (--model), beside the engine model "
                        "calibrated on group admission (not part of all); real-sglang-kv: "
                        "the same replicas short of KV memory, sample refill with fixed and "
                        "adaptive slots; real-vllm: the same on two real vLLM replicas, "
                        "calibrated on vLLM's own metrics; peer-areal: AReaL's own "
                        "rollout against the farm's group admission and sample refill, on "
                        "those real replicas and on "
                        "simulated ones at the reference shape, and the control plane's "
                        "price (needs AReaL's venv: QUEUE_ROLLOUT_AREAL_PYTHON)")
    p.add_argument("--json", action="store_true", help="one JSON object per profile")
    p.add_argument("--out", metavar="DIR", help="write report.md and PNG plots here "
                   "(needs matplotlib: queue-rollout[bench])")
    p.add_argument("--max-staleness", type=non_negative, default=None,
                   help="pilots: the staleness window (default 2: a 3-batch window; "
                        "kv-pressure 7)")
    p.add_argument("--time-scale", type=fraction, default=None,
                   help="pilots: measured seconds per reference second (default 0.1; "
                        "swe-agentic 1/60)")
    p.add_argument("--token-scale", type=fraction, default=None,
                   help="pilots: tokens generated per reference token (default 0.125)")
    p.add_argument("--refit", action="store_true",
                   help="swe-agentic, boba-math: fit the calibrated parameters to the "
                        "seed's group-admission baseline again, in virtual time, from the "
                        "shipped values; prints them (JSON) instead of running the pilot "
                        "(gpu-h200: both, on the H200's engine constants)")
    p.add_argument("--sensitivity", action="store_true",
                   help="swe-agentic, boba-math, boba-math-b8: also both modes' ideal "
                        "schedules with one modelling choice changed at a time (KV pool, "
                        "prompt, tool output, group spread), in the JSON and report")
    p.add_argument("--workers", type=positive, default=8,
                   help="control-plane: worker processes on each side (default 8)")
    p.add_argument("--episodes", type=positive, default=8000,
                   help="control-plane: episodes per side, over 2 rounds; a multiple of 8, "
                        "at least 32 (default 8000)")
    p.add_argument("--clients", type=positive, default=8,
                   help="ledger: concurrent clients (default 8)")
    p.add_argument("--seconds", type=float,
                   help="ledger: seconds per kind, summed over rounds (default 6); "
                        "sim-replica: seconds measured (default 60)")
    p.add_argument("--rounds", type=positive, default=3,
                   help="ledger: alternating segments of each kind (default 3)")
    p.add_argument("--wait-replicas", type=non_negative, default=0,
                   help="ledger, redis-load: start this many private replicas and make "
                        "every ledger change wait for them (farm.redis_wait_replicas)")
    p.add_argument("--placement", choices=["any", "group"], default="any",
                   help="pilots, ledger, redis-load: the farms' rollout.placement (default "
                        "any; long-prompt runs both)")
    p.add_argument("--replicas", type=non_negative, default=None,
                   help="redis-load: private replicas following the Redis (default: "
                        "--wait-replicas); more than --wait-replicas are followed, not "
                        "waited for")
    p.add_argument("--small", action="store_true",
                   help="peer-areal: the simulated setting alone, 32 groups, one run per "
                        "contender (no --model needed)")
    p.add_argument("--model", metavar="DIR",
                   help="real-sglang, real-vllm, peer-areal: the model the replicas serve "
                        "(the engine's Python: engine.python, else "
                        "$QUEUE_ROLLOUT_SGLANG_PYTHON or $QUEUE_ROLLOUT_VLLM_PYTHON)")
    p.add_argument("--repeats", type=positive, default=3,
                   help="real-sglang, real-vllm, peer-areal: runs per mode (contender), "
                        "alternating; "
                        "the median is reported (default 3)")
    p.add_argument("--cores", default="0,1",
                   help="real-sglang, real-vllm, peer-areal: the two CPU cores the replicas "
                        "are pinned to (default 0,1)")
    p.add_argument("--requests", type=positive, default=128,
                   help="sim-replica: concurrent requests (default 128)")
    p.add_argument("--gpus", type=positive, default=None,
                   help="redis-load: simulated GPUs (default 8; with --cells 6)")
    p.add_argument("--slots-per-gpu", type=positive, default=16,
                   help="redis-load: episode slots per GPU, threads of one process (16)")
    p.add_argument("--idle-s", type=float, default=None,
                   help="redis-load: seconds measured with nothing to do (default 30; "
                        "with --cells 20)")
    p.add_argument("--run-s", type=float, default=None,
                   help="redis-load: seconds measured with every slot running (default 30; "
                        "with --cells 20)")
    p.add_argument("--burst-groups", type=positive, default=None,
                   help="redis-load: groups of 8 tiny episodes in each burst (default 160; "
                        "with --cells 48)")
    p.add_argument("--cells", type=_cell_counts, default=None, metavar="K,K,...",
                   help="redis-load: farms of K cells instead (1: one Redis, which "
                        "calibrates; K > 1: a control Redis and K cells), each server "
                        "measured and set beside its prediction (e.g. 1,2,3)")
    p.add_argument("--burst-rounds", type=positive, default=3,
                   help="redis-load: bursts; the median one is the figure per episode "
                        "(default 3)")


def _bench_redis_cells(args: argparse.Namespace, work: Path) -> int:
    from queue_rollout.lab.bench.redis_cells import cells_text, run_cells_bench

    if args.wait_replicas or args.replicas is not None or args.placement != "any":
        raise ConfigError("--cells measures farms without replicas following their Redis "
                          "and with placement any: --wait-replicas, --replicas and "
                          "--placement are not taken with it")
    result = run_cells_bench(
        args.cells, gpus=args.gpus or 6, slots=args.slots_per_gpu,
        idle_s=_or(args.idle_s, 20.0), run_s=_or(args.run_s, 20.0),
        burst_groups=args.burst_groups or 48, burst_rounds=args.burst_rounds, workdir=work,
        progress=lambda line: print(line, file=sys.stderr))
    print(json.dumps(result) if args.json else cells_text(result))
    return 0


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _cell_counts(text: str) -> list[int]:
    try:
        counts = [int(k) for k in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or 1 not in counts:
        raise argparse.ArgumentTypeError(
            f"{text!r}: cell counts, comma-separated, 1 among them (it calibrates), e.g. 1,2,3")
    return counts


def run(config: Config, args: argparse.Namespace) -> int:
    """Run the profile *args* names (without one: list them, exit 2)."""
    if args.profile is None:
        width = max(map(len, BENCH_PROFILES))
        print("bench: choose one with --profile; each took about this long here:\n" +
              "\n".join(f"  {name:<{width}}  {took}" for name, took in BENCH_PROFILES.items()),
              file=sys.stderr)
        return 2
    if args.out:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise ConfigError("--out: the plots need matplotlib, which is not installed "
                              "(pip install 'queue-rollout[bench]'); nothing was run")
    if args.profile == "sim-replica":
        from queue_rollout.lab.bench.sim_replica import run_sim_replica_bench

        sim = run_sim_replica_bench(requests=args.requests,
                                    seconds=60.0 if args.seconds is None else args.seconds)
        print(json.dumps(sim.as_json()) if args.json else
              f"sim replica: {sim.concurrent_requests} requests in a closed loop, "
              f"{sim.completed} completed, {sim.cached_fraction:.0%} of prompt tokens "
              f"cached, {sim.retracted} retracted: {sim.cpu_fraction:.2%} of one core "
              f"over {sim.seconds:g} s")
        return 0
    import shlex

    if args.profile == "redis-load":
        import shutil

        if args.replicas is not None and args.replicas < args.wait_replicas:
            raise ConfigError(f"--replicas {args.replicas}: fewer than the "
                              f"--wait-replicas {args.wait_replicas} every change waits for")

        from queue_rollout.lab.bench.redis_load import redis_load_text, run_redis_load_bench
        from queue_rollout.progress import log_to_file

        work = (Path(config.farm.state_dir) / "bench-redis-load").resolve()
        shutil.rmtree(work, ignore_errors=True)  # a fresh Redis: its counters start at 0
        if not args.verbose:
            log_to_file(work / "bench.log")
        if args.cells is not None:
            return _bench_redis_cells(args, work)
        load = run_redis_load_bench(gpus=args.gpus or 8, slots=args.slots_per_gpu,
                                    wait_replicas=args.wait_replicas,
                                    placement=args.placement, replicas=args.replicas,
                                    idle_s=_or(args.idle_s, 30.0),
                                    run_s=_or(args.run_s, 30.0),
                                    burst_groups=args.burst_groups or 160,
                                    burst_rounds=args.burst_rounds, workdir=work,
                                    logs=not args.verbose,
                                    progress=lambda line: print(line, file=sys.stderr))
        result = load.as_json()
        print(json.dumps(result) if args.json else redis_load_text(result))
        if not args.verbose:
            print(f"logs: {work}", file=sys.stderr)
        return 0

    if args.profile in ("real-sglang", "real-sglang-kv", "real-vllm"):
        return _bench_real_sglang(config, args)
    if args.profile == "peer-areal":
        return _bench_peer_areal(config, args)
    from queue_rollout.lab.bench.main import BenchArgs, run_bench

    if args.refit and args.profile not in ("swe-agentic", "boba-math", "gpu-h200"):
        raise ConfigError(f"--refit: {args.profile} has no calibration to fit "
                          "(swe-agentic and boba-math have; gpu-h200 fits both again on "
                          "the H200's constants)")
    return run_bench(BenchArgs(
        profile=args.profile, json=args.json, out=Path(args.out) if args.out else None,
        max_staleness=args.max_staleness, time_scale=args.time_scale,
        token_scale=args.token_scale, cp_workers=args.workers, cp_episodes=args.episodes,
        ledger_clients=args.clients, ledger_seconds=6.0 if args.seconds is None else args.seconds,
        ledger_rounds=args.rounds, refit=args.refit, sensitivity=args.sensitivity,
        wait_replicas=args.wait_replicas, placement=args.placement,
        command="queue-rollout " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        workdir=Path(config.farm.state_dir) / "bench", verbose=args.verbose))


def _cores(args: argparse.Namespace) -> tuple[int, int]:
    try:
        cores = tuple(int(c) for c in args.cores.split(","))
    except ValueError:
        cores = ()
    if len(cores) != 2:
        raise ConfigError(f"--cores: two cores, one per replica, like 0,1; got {args.cores!r}")
    return cores[0], cores[1]


def _progress() -> Callable[[str], None]:
    """Progress lines on stderr, each with the seconds since the bench began."""
    started = time.monotonic()
    return lambda line: print(f"[{time.monotonic() - started:7.1f}s] {line}",
                              file=sys.stderr, flush=True)


def _bench_real_sglang(config: Config, args: argparse.Namespace) -> int:
    """real-sglang, real-sglang-kv and real-vllm: two real replicas of this machine."""
    from queue_rollout.lab.bench.real_sglang import real_sglang_text, run_real_sglang, write_json
    from queue_rollout.lab.bench.real_vllm import run_real_vllm
    from queue_rollout.launch.node import engine_python
    from queue_rollout.progress import log_to_file

    if not args.model:
        raise ConfigError(f"--model: the {args.profile} profile needs the model its replicas "
                          "serve (a folder with config.json)")
    cores = _cores(args)
    work = (Path(config.farm.state_dir) / f"bench-{args.profile}").resolve()
    if not args.verbose:
        log_to_file(work.parent / f"bench-{args.profile}.log")
    model = Path(args.model).expanduser().resolve()
    if args.profile == "real-vllm":
        python = engine_python(msgspec.structs.replace(config.engine, kind="vllm"))
        result = run_real_vllm(model, python, work, repeats=args.repeats, cores=cores,
                               progress=_progress())
    else:
        result = run_real_sglang(model, engine_python(config.engine), work,
                                 kv_pressure=args.profile == "real-sglang-kv",
                                 repeats=args.repeats, cores=cores, progress=_progress())
    write_json(work / "result.json", result)
    print(json.dumps(result) if args.json else real_sglang_text(result))
    print(f"logs and result.json: {work}", file=sys.stderr)
    return 0


def _bench_peer_areal(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.lab.bench.peer_areal import peer_text, run_peer_areal, write_json
    from queue_rollout.launch.node import engine_python
    from queue_rollout.progress import log_to_file

    if not args.small and not args.model:
        raise ConfigError("--model: peer-areal's real setting needs the model its SGLang "
                          "replicas serve (a folder with config.json); --small runs the "
                          "simulated setting alone")
    cores = _cores(args)
    work = (Path(config.farm.state_dir) / "bench-peer-areal").resolve()
    if not args.verbose:
        log_to_file(work.parent / "bench-peer-areal.log")
    result = run_peer_areal(
        work, model=Path(args.model).expanduser().resolve() if args.model else None,
        sglang_python="" if args.small else engine_python(config.engine),
        repeats=args.repeats, cores=cores, small=args.small, progress=_progress())
    write_json(work / "result.json", result)
    print(json.dumps(result) if args.json else peer_text(result))
    print(f"logs and result.json: {work}", file=sys.stderr)
    return 0
