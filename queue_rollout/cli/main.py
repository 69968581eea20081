"""The ``queue-rollout`` command line.

Exit codes: 0 ok; 1 an invariant violation; 2 bad input or config; 3 a timeout;
4 Redis unreachable. Every error the package raises maps to one of them here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from queue_rollout import __version__
from queue_rollout.argtypes import (
    choices,
    fraction,
    int_list,
    non_negative,
    non_negative_float,
    positive,
    positive_float,
)
from queue_rollout.cli import release, trace
from queue_rollout.config import Config, load_config
from queue_rollout.errors import ConfigError, QueueRolloutError
from queue_rollout.lab.bench import cli as bench_cli

if TYPE_CHECKING:
    import redis

    from queue_rollout.ledger.keys import Keys

log = logging.getLogger("queue_rollout")


def _cmd_doctor(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.ledger.connection import connect_config
    from queue_rollout.ledger.doctor import examine, repair
    from queue_rollout.ledger.keys import Keys
    from queue_rollout.ledger.shape import check_schema

    client = connect_config(config)
    check_schema(client, config)  # another schema's records are not this doctor's to judge
    keys = Keys(config.farm.name)
    b = config.rollout.batch_size
    if config.cells:
        return _doctor_cells(config, client, keys, repair=args.repair)
    report = repair(client, keys, b) if args.repair else examine(client, keys, b)
    for problem in report.problems:
        print(f"doctor: {problem}")
    if args.repair:
        if report.problems:
            print(f"doctor: repaired {len(report.problems)} problem(s) from the ledger's records")
        else:
            print("doctor: ok, nothing to repair")
        return 0
    if report.problems:
        print(f"doctor: {len(report.problems)} problem(s); `queue-rollout doctor --repair` "
              "mends them from the ledger's records")
        return 1
    print(f"doctor: ok ({report.expected['reserved']} slots reserved, "
          f"{report.expected['in_flight']} groups in flight)")
    return 0


def _doctor_cells(config: Config, control: redis.Redis, keys: Keys, *, repair: bool) -> int:
    """`doctor` on a farm of cells: each cell as a farm of one (repaired with
    ``--repair``), then the control Redis against its records and the cells' (reported:
    ``--repair`` leaves it)."""
    from queue_rollout.ledger import doctor
    from queue_rollout.ledger.connection import connect_config
    from queue_rollout.ledger.shape import check_schema

    b = config.rollout.batch_size
    clients, problems = {}, 0
    for cell in config.cells:
        seen = config.for_cell(cell.name)
        clients[cell.name] = client = connect_config(seen)
        check_schema(client, seen)
        report = (doctor.repair if repair else doctor.examine)(client, keys, b)
        for problem in report.problems:
            print(f"doctor: cell {cell.name}: {problem}")
        problems += 0 if repair else len(report.problems)
        print(f"doctor: cell {cell.name}: " + (
            f"repaired {len(report.problems)} problem(s)" if repair and report.problems else
            f"{len(report.problems)} problem(s)" if report.problems else
            f"ok ({report.expected['reserved']} slots reserved, "
            f"{report.expected['in_flight']} groups in flight)"))
    farm = doctor.examine_control(control, keys, b, clients)
    for problem in farm.problems:
        print(f"doctor: control: {problem}")
    print("doctor: control: " + (f"{len(farm.problems)} problem(s) (not repaired here)"
                                 if farm.problems else
                                 f"ok ({farm.expected['in_flight']} groups in flight)"))
    return 1 if problems or farm.problems else 0


def _cmd_status(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.ledger.connection import connect_config, mask_url, resolve_url
    from queue_rollout.ledger.status import cells_status, farm_status, format_status

    client = connect_config(config)
    if config.cells:
        status = cells_status(client, {c.name: connect_config(config.for_cell(c.name))
                                       for c in config.cells}, config)
    else:
        status = farm_status(client, config, redis_url=mask_url(resolve_url(config)))
    print(json.dumps(status) if args.json else format_status(status))
    return 0


def _cmd_plan(config: Config, args: argparse.Namespace) -> int:
    import shlex

    from queue_rollout.lab.plan.main import PlanArgs, run

    if args.cells:
        from queue_rollout.lab.plan.cells import run_cells

        print(run_cells(gpus=args.gpus, slots=args.slots_per_replica,
                        episode_s=args.episode_s, group_size=args.group_size,
                        batch_size=args.batch_size,
                        redis_load=Path(args.redis_load) if args.redis_load else None,
                        as_json=args.json))
        return 0

    given = [flag for flag, value in (("--profile", args.profile),
                                      ("--workload", args.workload),
                                      ("--from-farm", args.from_farm)) if value]
    if len(given) > 1:
        raise ConfigError(f"plan: give one workload, not {' and '.join(given)}")
    recorded = None
    if args.from_farm:
        from queue_rollout.ledger.connection import connect_config
        from queue_rollout.ledger.group_shapes import recorded_shapes
        from queue_rollout.ledger.keys import Keys
        from queue_rollout.ledger.registry import Registry

        client = connect_config(config)
        try:
            keys = Keys(config.farm.name)
            recorded = tuple(recorded_shapes(client, keys))
            live = len(Registry(client, keys, config.timeouts.lease).live())
        finally:
            client.close()
        # the farm's own shape where no flag says otherwise: its replicas (the live
        # workers, else engine.urls, else engine.replicas), slots and batch size
        if args.gpus is None:
            e = config.engine
            args.gpus, source = ((live, "live workers") if live else
                                 (len(e.urls), "engine.urls") if e.urls else
                                 (e.replicas, "engine.replicas"))
            print(f"plan: {args.gpus} replicas, from the farm's {source} (--gpus to change)",
                  file=sys.stderr)
        args.slots_per_replica = args.slots_per_replica or config.engine.slots_per_replica
        args.batch_size = args.batch_size or config.rollout.batch_size
    return run(PlanArgs(
        profile=args.profile, workload=Path(args.workload) if args.workload else None,
        recorded=recorded, farm=config.farm.name,
        gpus=args.gpus, slots_per_replica=args.slots_per_replica, group_size=args.group_size,
        batch_size=args.batch_size, batches=args.batches, train_s=args.train_s,
        max_staleness=tuple(args.max_staleness or ()), modes=tuple(args.modes),
        placements=tuple(args.placement or (config.rollout.placement,)),
        slots=tuple(args.slots or ("adaptive" if config.engine.adaptive_slots else "fixed",)),
        min_slots_per_replica=config.engine.min_slots_per_replica,
        time_scale=args.time_scale, token_scale=args.token_scale, seed=args.seed,
        redis_load=Path(args.redis_load) if args.redis_load else None, json=args.json,
        out=Path(args.out) if args.out else None,
        command="queue-rollout " + " ".join(shlex.quote(a) for a in sys.argv[1:])),
        default_staleness=config.rollout.max_staleness)


_mode_list = choices("mode(s)", ("group", "sample"))
_placement_list = choices("placement(s)", ("any", "group"))
_slots_list = choices("slot setting(s)", ("fixed", "adaptive"))


#: The bench's pilots, which ``plan`` takes as workloads.
PLAN_PROFILES = ("long-tail", "equal", "group-between", "mixed-tail", "swe-agentic",
                 "boba-math", "boba-math-b8", "long-prompt", "kv-pressure")


def _cmd_demo(config: Config, args: argparse.Namespace) -> int:
    if args.virtual:
        from queue_rollout.lab.demo.virtual import run_demo

        return run_demo(config, prompts=args.prompts, batches=args.batches, out=sys.stdout)
    from queue_rollout.lab.demo.stack import run_stack_demo

    return run_stack_demo(config, out=sys.stdout, verbose=args.verbose)


def _cmd_up(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.launch.up import run_up

    return run_up(config, request_log_dir=Path(args.request_log_dir)
                  if args.request_log_dir else None, verbose=args.verbose)


def _cmd_collector(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.collector.loop import run_collector

    return run_collector(config)


def _cmd_consume(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.client.rollout import RolloutClient

    client = RolloutClient.from_config(config, consumer=args.consumer)
    for k in range(1, args.batches + 1):
        batch = client.get_batch(timeout=args.timeout)
        groups: list[dict[str, Any]] = [{"id": g.id, "members": [
            {"member": m.member, "output_tokens": len(m.output_ids), "reward": m.reward,
             "finish_reason": m.finish_reason, "versions": sorted(set(m.versions)),
             "turn_lengths": m.turn_lengths}
            for m in g.members]} for g in batch.groups]
        client.ack(batch)
        if not args.no_version_bump:
            client.set_version(client.version() + 1)
        if args.json:
            print(json.dumps({"batch": k, "version": batch.version,
                              "redelivered": batch.redelivered, "groups": groups}), flush=True)
        else:
            print(f"batch {k}: {len(groups)} groups at version {batch.version}: "
                  f"{', '.join(g['id'] for g in groups)}", flush=True)
    return 0


def _cmd_pause(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.client.rollout import RolloutClient

    RolloutClient.from_config(config).pause()
    print(f"farm {config.farm.name} paused ({config.engine.pause_mode}); "
          "every live worker confirmed")
    return 0


def _cmd_resume(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.client.rollout import RolloutClient

    RolloutClient.from_config(config).resume()
    print(f"farm {config.farm.name} resumed")
    return 0


def _cmd_set_version(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.errors import BadInput
    from queue_rollout.ledger import cells

    if args.version < 0:
        raise BadInput(f"set-version: N must be >= 0, got {args.version}")
    previous = cells.set_version(*cells.connect_farm(config), args.version)
    print(f"policy version {previous} -> {args.version}")
    return 0


def _cmd_submit(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.client.prompts import farm_needs, known_ids_refusal, read_numbered
    from queue_rollout.errors import BadInput
    from queue_rollout.ledger import cells

    # The whole file is validated before Redis is touched, against what the farm's
    # workflow needs of a prompt too (a file without a prompt is refused); the submit
    # script then checks every id against the farm before it writes anything.
    prompts = read_numbered(args.file, max_bytes=config.limits.max_prompt_bytes,
                            needs=farm_needs(config))
    ledger, cell_ledgers = cells.connect_farm(config)
    checked = [(pid, raw) for _, pid, raw in prompts]
    answer = (cells.submit(cell_ledgers, config.cell_weights(), checked) if cell_ledgers
              else ledger.submit(checked))
    if answer.status == "duplicate":
        places = {pid: f"line {number}" for number, pid, _ in prompts}
        raise BadInput(f"{args.file}: {known_ids_refusal(answer.duplicates, places)}")
    print(f"submitted {answer.count} prompts to farm {config.farm.name}")
    return 0


def _cell_view(config: Config, cell: str | None, command: str) -> Config:
    """The farm as the workers of *cell* see it: on a farm of cells, the cell's Redis
    and share (:meth:`Config.for_cell`); a farm of one Redis takes no cell."""
    if config.cells and not cell:
        names = ", ".join(c.name for c in config.cells)
        raise ConfigError(f"{command}: the farm has cells ({names}): name the one its "
                          "workers join with --cell")
    if cell and not config.cells:
        raise ConfigError(f"{command} --cell {cell}: the farm has no [[cells]]")
    return config.for_cell(cell) if cell else config


def _cmd_worker(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.workers.supervisor import Supervisor

    return Supervisor(_cell_view(config, args.cell, "worker"), gpu=args.gpu,
                      engine_url=args.engine_url, boot_id=args.boot_id or "").run()


def _cmd_node(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.launch.node import parse_gpus, run_node

    return run_node(_cell_view(config, args.cell, "node"), parse_gpus(args.gpus))


def _cmd_sim_engine(config: Config, args: argparse.Namespace) -> int:
    from queue_rollout.errors import bind_failed
    from queue_rollout.lab.sim.server import PortUnavailable, run_sim_engine

    e = config.engine
    pool = args.max_total_tokens or e.max_total_tokens
    chunk = args.chunked_prefill_size or e.chunked_prefill_size
    if pool < chunk:
        raise ConfigError(f"--max-total-tokens: a pool of {pool} tokens is smaller than one "
                          f"prefill chunk ({chunk} tokens)")
    try:
        run_sim_engine(
            host=args.host, port=args.port, slots=args.slots or e.slots_per_replica,
            step_ms=e.step_ms if args.step_ms is None else args.step_ms,
            step_ms_per_request=(e.step_ms_per_request if args.step_ms_per_request is None
                                 else args.step_ms_per_request),
            request_log=Path(args.request_log) if args.request_log else None,
            boot_id=args.boot_id,
            prefill_tokens_per_s=args.prefill_tokens_per_s or e.prefill_tokens_per_s,
            chunked_prefill_size=chunk, max_total_tokens=pool,
        )
    except PortUnavailable as exc:  # one line naming the port, not a traceback
        raise bind_failed("--port", args.host, args.port, exc) from None
    return 0


def _common(where: str) -> argparse.ArgumentParser:
    """``-c`` and ``-v``, taken before the command (*where* ``global``) and after it;
    each place has its own names, so that one does not overwrite the other."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", metavar="FARM.toml", dest=f"{where}_config",
                        help="farm config (TOML); without it, the built-in defaults")
    common.add_argument("-v", "--verbose", action="store_true", dest=f"{where}_verbose",
                        help="debug logging")
    return common


def _settle_common(args: argparse.Namespace) -> None:
    """One ``config`` and ``verbose`` from the two places they may be given; two
    different configs are bad input."""
    before, after = args.global_config, args.command_config
    if before and after and Path(before).resolve() != Path(after).resolve():
        raise ConfigError(f"-c given twice, as {before} before the command and {after} "
                          "after it; give one")
    args.config = before or after
    args.verbose = args.global_verbose or args.command_verbose


def build_parser() -> argparse.ArgumentParser:
    common = _common("command")
    parser = argparse.ArgumentParser(
        prog="queue-rollout", parents=[_common("global")],
        description="Sample-level refill for LLM RL rollouts across a GPU farm: a Redis "
                    "ledger, RQ workers, SGLang replicas.",
        epilog="Exit codes: 0 ok; 1 an invariant violation; 2 bad input or config; "
               "3 a timeout; 4 Redis unreachable.")
    parser.add_argument("--version", action="version", version=f"queue-rollout {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[Config, argparse.Namespace], int],
            help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(handler=handler)
        return p

    p = add("demo", _cmd_demo,
            "zero-config demo: both admission modes on a long-tail prompt set through the "
            "real stack (embedded Redis, simulated replicas, workers, collector, trainer)")
    p.add_argument("--virtual", action="store_true",
                   help="instead: the reference shape (128 slots, 128 groups) in virtual "
                        "time, the real ledger deciding")
    p.add_argument("--prompts", type=int, default=128, help="--virtual: prompt groups (128)")
    p.add_argument("--batches", type=int, default=6,
                   help="--virtual: batches trained on before the drain (default 6)")

    p = add("up", _cmd_up, "a whole local farm in the foreground (embedded Redis, sim "
            "replicas, workers, collector) until Ctrl-C")
    p.add_argument("--request-log-dir", metavar="DIR",
                   help="sim replicas: each appends one JSON line per request to "
                        "DIR/replica-<i>.jsonl (rid, tokens, prompt and cached tokens)")

    add("collector", _cmd_collector,
        "the collector: admission, outbox, group judgement, reconciler (leader-elected)")

    p = add("submit", _cmd_submit,
            "validate and enqueue prompts (JSON Lines); bad input: exit 2, nothing enqueued")
    p.add_argument("file", metavar="FILE.jsonl")

    p = add("consume", _cmd_consume,
            "take N batches as a trainer would: wait, ack, raise the policy version")
    p.add_argument("--batches", type=int, required=True, help="how many batches")
    p.add_argument("--json", action="store_true", help="one JSON object per batch")
    p.add_argument("--consumer", default="trainer-0", help="consumer id (default trainer-0)")
    p.add_argument("--no-version-bump", action="store_true",
                   help="do not raise the policy version after each batch")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds to wait for each batch (default 3600; then exit 3)")

    add("pause", _cmd_pause,
        "stop admission; return once every live worker has paused its replica (exit 3: timeout)")
    add("resume", _cmd_resume, "undo pause")

    p = add("set-version", _cmd_set_version, "set the policy version")
    p.add_argument("version", type=int, metavar="N")

    p = add("status", _cmd_status, "farm state")
    p.add_argument("--json", action="store_true", help="one JSON object")

    p = add("release", release.cmd_release, release.HELP)
    release.configure(p)

    p = add("trace", trace.cmd_trace, trace.HELP)
    trace.configure(p)

    p = add("doctor", _cmd_doctor,
            "check the ledger's counters against its records; exit 1 on a violation")
    p.add_argument("--repair", action="store_true",
                   help="rewrite the counters from the records (pause admission first)")

    p = add("worker", _cmd_worker,
            "one GPU's worker: engine.slots_per_replica episode workers on its replica")
    p.add_argument("--gpu", type=int, required=True, help="GPU index (names the worker)")
    p.add_argument("--engine-url", required=True, help="the replica, e.g. http://127.0.0.1:30000")
    p.add_argument("--boot-id", help="the replica start's boot id (SGLang has none of its own)")
    p.add_argument("--cell", help="on a farm of cells ([[cells]]): the cell it joins")

    p = add("node", _cmd_node,
            "one replica (SGLang or sim) and one worker per GPU of this host")
    p.add_argument("--gpus", required=True, metavar="LIST",
                   help="GPU indices: 0-7, 0,2,5 or 0-3,6; replica i listens on "
                        "engine.base_port + i")
    p.add_argument("--cell", help="on a farm of cells ([[cells]]): the cell its workers join")

    p = add("sim-engine", _cmd_sim_engine,
            "one simulated replica speaking SGLang's HTTP API (engine.* sets its timing)")
    p.add_argument("--port", type=int, required=True, help="port to listen on (0: any free)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--slots", type=int, help="max running requests (engine.slots_per_replica)")
    p.add_argument("--step-ms", type=float, help="decode step with one request (engine.step_ms)")
    p.add_argument("--step-ms-per-request", type=float,
                   help="added per running request (engine.step_ms_per_request)")
    p.add_argument("--prefill-tokens-per-s", type=positive_float,
                   help="uncached context computed per second (engine.prefill_tokens_per_s)")
    p.add_argument("--chunked-prefill-size", type=positive,
                   help="most tokens in one prefill round (engine.chunked_prefill_size)")
    p.add_argument("--max-total-tokens", type=positive,
                   help="KV pool of running requests and the prefix cache "
                        "(engine.max_total_tokens)")
    p.add_argument("--request-log", metavar="FILE", help="append one JSON line per request")
    p.add_argument("--boot-id", help="the boot id to report (default: a new one)")

    p = add("bench", bench_cli.run, bench_cli.HELP)
    bench_cli.add_arguments(p)

    p = add("plan", _cmd_plan,
            "will refill help this workload, and how far does one Redis carry the farm: "
            "each setting's ideal schedule (the ledger's scripts on a private Redis, "
            "the engine model, virtual time), a recommendation and the Redis headroom")
    p.add_argument("--profile", choices=list(PLAN_PROFILES), default=None,
                   help="a bench profile's workload and shape (default long-tail)")
    p.add_argument("--workload", metavar="FILE.jsonl",
                   help="group shapes, one JSON object a line: {\"prompt_tokens\": N, "
                        "\"members\": [{\"output_tokens\": N} | {\"turns\": [{\"gen\": N, "
                        "\"tool_s\": S, \"tool_tokens\": N}, ...]}, ...]}; whole groups "
                        "are sampled by --seed")
    p.add_argument("--from-farm", action="store_true",
                   help="the group shapes the farm of -c recorded (the newest 4,096 groups "
                        "that completed with every member finished; `status` shows how "
                        "many), sampled by --seed")
    p.add_argument("--gpus", type=positive, help="replicas, one per GPU (default: the "
                   "profile's; 8; --from-farm: its live workers, else engine.urls, else "
                   "engine.replicas)")
    p.add_argument("--slots-per-replica", type=positive,
                   help="episode slots per replica (default 16; --from-farm: "
                        "engine.slots_per_replica)")
    p.add_argument("--group-size", type=positive, help="G (default: the workload's)")
    p.add_argument("--batch-size", type=positive,
                   help="B, groups per batch (default 16; --from-farm: rollout.batch_size)")
    p.add_argument("--batches", type=positive,
                   help="K: K x B prompts, a training pause after each batch (default: the "
                        "profile's schedule; a workload file 8)")
    p.add_argument("--train-s", type=non_negative_float,
                   help="seconds of training after each batch (default 10)")
    p.add_argument("--max-staleness", type=int_list,
                   help="settings to compare, e.g. 0,1,2,4 (default: the config's "
                        "rollout.max_staleness)")
    p.add_argument("--modes", type=_mode_list, default=["group", "sample"],
                   help="admission modes to compare (default group,sample)")
    p.add_argument("--placement", type=_placement_list,
                   help="rollout.placement settings to compare, e.g. any,group (default: "
                        "the config's); the table adds prefill computed per group")
    p.add_argument("--slots", type=_slots_list,
                   help="episode slots per replica to compare: fixed, adaptive (each "
                        "worker's limit follows its replica's KV room), or fixed,adaptive "
                        "(default: the config's engine.adaptive_slots); the table adds the "
                        "workers' mean limit")
    p.add_argument("--time-scale", type=fraction, default=1.0,
                   help="simulated seconds per real second of the workload (default 1)")
    p.add_argument("--token-scale", type=fraction, default=1.0,
                   help="tokens simulated per token of the workload (default 1)")
    p.add_argument("--seed", type=non_negative, default=0,
                   help="which groups a workload file's sample draws (default 0)")
    p.add_argument("--redis-load", metavar="FILE",
                   help="Redis costs from `bench --profile redis-load --json` (default: "
                        "the figures shipped with the package)")
    p.add_argument("--cells", action="store_true",
                   help="instead: how many cells (Redis servers) a farm of --gpus x "
                        "--slots-per-replica with --episode-s episodes needs, and each "
                        "server's share of a quiet core, by arithmetic from --redis-load "
                        "(a run with units) and the control Redis's cost per group, "
                        "measured on a private Redis")
    p.add_argument("--episode-s", type=positive_float,
                   help="--cells: the mean seconds an episode runs")
    p.add_argument("--json", action="store_true", help="one JSON object per setting")
    p.add_argument("--out", metavar="DIR", help="write plan.md, plan.jsonl and PNG plots "
                   "here (needs matplotlib: queue-rollout[bench])")
    return parser


#: The commands that take a farm of cells ([[cells]]): the others refuse its config.
RUN_ON_CELLS = frozenset({"up", "collector", "node", "worker", "consume", "sim-engine",
                          "doctor", "pause", "resume", "submit", "set-version", "release",
                          "status", "trace"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _settle_common(args)
    except ConfigError as exc:
        print(f"queue-rollout: {exc}", file=sys.stderr)
        return exc.exit_code
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr,
    )
    try:
        config = load_config(args.config)
        if (config.cells and args.command not in RUN_ON_CELLS
                and not (args.command == "plan" and args.cells)):
            raise ConfigError(f"{args.command}: does not run on a farm of cells ([[cells]]) "
                              f"yet; these do: {', '.join(sorted(RUN_ON_CELLS))}, "
                              "plan --cells and RolloutClient")
        handler: Callable[[Config, argparse.Namespace], int] = args.handler
        return handler(config, args)
    except QueueRolloutError as exc:
        print(f"queue-rollout: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader left (`status | head -1`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
