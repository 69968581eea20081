"""``queue-rollout node --gpus 0-7``: one replica and one worker per GPU of this host.

For each GPU i: a replica on port ``engine.base_port + i``, bound to 127.0.0.1 — SGLang
(``python -m sglang.launch_server`` with the model, ``CUDA_VISIBLE_DEVICES`` pinned to
the GPU, ``--enable-metrics``, ``--enable-deterministic-inference`` when
``engine.deterministic``, ``--max-running-requests engine.slots_per_replica``, then
``engine.sglang_args``), vLLM (``python -m vllm.entrypoints.openai.api_server`` with the
model, ``--enable-scale-out`` for its token-in, token-out route, ``--max-num-seqs
engine.slots_per_replica``, then ``engine.vllm_args``; ``VLLM_SERVER_DEV_MODE=1`` for
pause, abort and the reload) or, with ``engine.kind = "sim"``, a simulated replica. A
real engine runs under the Python that has it (``engine.python``, else the environment
variable ``QUEUE_ROLLOUT_SGLANG_PYTHON`` or ``QUEUE_ROLLOUT_VLLM_PYTHON``, else node's
own), with node's environment; a CPU SGLang server (``--device cpu`` among
``engine.sglang_args``) also gets ``SGLANG_USE_CPU_ENGINE=1``. A config whose replicas
cannot start (no model, no engine in that Python, deterministic inference on a CPU) is
refused before anything starts. Every
replica start gets a new boot id, recorded in ``<state_dir>/node/boots.jsonl`` (a
simulated replica's requests go to ``requests-gpuN.jsonl`` beside it); once the
replica answers ``/health``, a worker pinned to it starts with that boot id
(``--boot-id``). When a replica dies it is restarted with backoff under a new boot id,
and its worker is restarted too, so the worker settles the old boot's attempts as
stopped (the boot changed) and carries on. A dead worker is restarted with backoff.
Every replica and worker runs in its own session, so a terminal's Ctrl-C reaches only
`node`. SIGTERM or Ctrl-C: the workers first, together (their episodes finish within
``timeouts.shutdown_grace``), then the replicas; a second Ctrl-C stops every process at
once (what was running is redone, as after a crash). A hard stop (SIGKILL) of `node`
takes its children with it (:mod:`queue_rollout.procs`), and the next `node` on the
same ``state_dir`` first stops whatever of the recorded tree is left (:mod:`.lineage`).
A port of ``engine.base_port + i`` already in use is refused before anything starts
(exit 2), and a child that exits with 2 (bad input or config) stops the node instead of
being restarted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from queue_rollout.config import Config, EngineConfig, write_config
from queue_rollout.errors import ConfigError, bind_failed
from queue_rollout.launch.lineage import Lineage
from queue_rollout.launch.owner import Owner
from queue_rollout.launch.targets import (
    NODE_FILE,
    clear_targets,
    targets_path,
    write_node_targets,
)
from queue_rollout.ledger.connection import connect_config
from queue_rollout.ledger.shape import check_shape
from queue_rollout.procs import Supervised, cli_exe, sim_engine_argv, stop_all

log = logging.getLogger(__name__)
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
#: Name the Python that has SGLang, or vLLM, when ``engine.python`` is unset.
SGLANG_PYTHON_ENV = "QUEUE_ROLLOUT_SGLANG_PYTHON"
VLLM_PYTHON_ENV = "QUEUE_ROLLOUT_VLLM_PYTHON"
#: The engine kinds node launches a server of: the variable naming its Python, and the
#: package that Python must import.
ENGINES = {"sglang": (SGLANG_PYTHON_ENV, "sglang"), "vllm": (VLLM_PYTHON_ENV, "vllm")}
#: SGLang's launch arguments for a server on the CPU (``engine.sglang_args``).
#: ``--sleep-on-idle``: an idle scheduler otherwise polls without pause and holds a
#: whole core.
CPU_SGLANG_ARGS = ("--device", "cpu", "--attention-backend", "torch_native",
                   "--disable-cuda-graph", "--sleep-on-idle")
#: Whether a Python can import the package named after it, without importing it (that
#: takes seconds).
FIND_PACKAGE = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"


def parse_gpus(text: str) -> list[int]:
    """``0-7``, ``0,2,5`` or ``0-3,6`` -> GPU indices, in order, each once."""
    gpus: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ConfigError(f"--gpus: {text!r} is not a list of GPU indices like 0-7 or 0,2,5")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last < first:
            raise ConfigError(f"--gpus: range {part.strip()!r} runs backwards")
        gpus += [g for g in range(first, last + 1) if g not in gpus]
    return gpus


def replica_argv(config: Config, gpu: int, port: int, boot_id: str,
                 request_log: Path | None = None) -> list[str]:
    """The command line of the replica for *gpu* (pinned through the environment); a
    simulated replica appends its requests to *request_log*."""
    e = config.engine
    if e.kind == "sim":
        return [*sim_engine_argv(e, port), "--boot-id", boot_id,
                *(["--request-log", str(request_log)] if request_log else [])]
    if not e.model_path:
        raise ConfigError(f'engine.model_path: `node` with engine.kind = "{e.kind}" needs the '
                          'model')
    if e.kind == "vllm":
        return [engine_python(e), "-m", "vllm.entrypoints.openai.api_server", "--model",
                e.model_path, "--host", "127.0.0.1", "--port", str(port),
                "--enable-scale-out", "--max-num-seqs", str(e.slots_per_replica),
                *e.vllm_args]
    if e.deterministic and sglang_device(e.sglang_args) == "cpu":
        raise ConfigError(
            "engine.deterministic: a CPU server (--device cpu in engine.sglang_args) refuses "
            "--enable-deterministic-inference, which does not run with its torch-native "
            "attention; set engine.deterministic = false (greedy decoding, temperature 0, "
            "is deterministic there)")
    argv = [engine_python(e), "-m", "sglang.launch_server", "--model-path", e.model_path,
            "--host", "127.0.0.1", "--port", str(port), "--enable-metrics",
            "--max-running-requests", str(e.slots_per_replica)]
    if e.deterministic:
        argv.append("--enable-deterministic-inference")
    return argv + list(e.sglang_args)


def _python_env(e: EngineConfig) -> str:
    return ENGINES.get(e.kind, ENGINES["sglang"])[0]


def engine_python(e: EngineConfig) -> str:
    """The Python that runs the engine's server: ``engine.python``, else the variable
    naming it (``$QUEUE_ROLLOUT_SGLANG_PYTHON`` or ``$QUEUE_ROLLOUT_VLLM_PYTHON``), else
    this one."""
    return e.python or os.environ.get(_python_env(e)) or sys.executable


def _python_named_by(e: EngineConfig) -> str:
    """Where :func:`engine_python` found its answer, for messages."""
    if e.python:
        return "engine.python"
    if os.environ.get(_python_env(e)):
        return _python_env(e)
    return f"node's own Python: neither engine.python nor {_python_env(e)} is set"


def sglang_device(args: list[str]) -> str | None:
    """The ``--device`` among SGLang's launch *args* (the last one, as argparse takes),
    or None."""
    device = None
    for i, arg in enumerate(args):
        if arg == "--device" and i + 1 < len(args):
            device = args[i + 1]
        elif arg.startswith("--device="):
            device = arg.partition("=")[2]
    return device


def replica_env(config: Config, gpu: int) -> dict[str, str]:
    """The replica's environment: node's own, pinned to *gpu*; a CPU SGLang server also
    gets ``SGLANG_USE_CPU_ENGINE=1`` (SGLang does not see the CPU device without it), a
    vLLM server ``VLLM_SERVER_DEV_MODE=1`` (its pause, abort by id and weight reload)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    e = config.engine
    if e.kind == "sglang" and sglang_device(e.sglang_args) == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    if e.kind == "vllm":
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def check_engine_python(e: EngineConfig, env: dict[str, str]) -> None:
    """ConfigError unless :func:`engine_python` can import the engine with *env*."""
    variable, package = ENGINES.get(e.kind, ENGINES["sglang"])
    python = engine_python(e)
    try:
        probe = subprocess.run([python, "-c", FIND_PACKAGE, package], env=env,
                               capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = f"cannot be run ({exc})"
    else:
        if probe.returncode == 0:
            return
        problem = f"cannot import {package}"
    name = "SGLang" if package == "sglang" else "vLLM"
    raise ConfigError(
        f"engine.python: {python} ({_python_named_by(e)}) {problem}: install {name} for that "
        f"Python, or set engine.python (or the environment variable {variable}) to "
        "a Python that has it")


def check_replicas(config: Config, gpus: list[int]) -> None:
    """Refuse, before anything starts, a config whose replicas cannot start."""
    replica_argv(config, gpus[0], config.engine.base_port, "check")
    if config.engine.kind in ENGINES:
        check_engine_python(config.engine, replica_env(config, gpus[0]))


def check_ports(config: Config, gpus: list[int], host: str = "127.0.0.1") -> None:
    """ConfigError, naming ``engine.base_port``, when a replica's port is taken now (a
    replica would fail to bind it, and be restarted again and again)."""
    base = config.engine.base_port
    for i, gpu in enumerate(gpus):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            try:
                sock.bind((host, base + i))
            except OSError as exc:
                key = "engine.base_port" if i == 0 else f"engine.base_port + {i} (GPU {gpu})"
                raise bind_failed(key, host, base + i, exc) from None


@dataclass
class GpuSlot:
    """One GPU: its replica, the replica's current boot, and the worker pinned to it."""

    gpu: int
    port: int
    replica: Supervised
    worker: Supervised | None = None
    boot_id: str = ""
    healthy: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Node:
    config: Config
    config_path: Path
    gpus: list[int]
    state_dir: Path
    slots: list[GpuSlot] = field(default_factory=list)
    health_timeout: float = 2.0
    lineage: Lineage | None = None  # where the replicas and workers are recorded

    def __post_init__(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        write_config(self.config_path, self.config)
        for i, gpu in enumerate(self.gpus):
            port = self.config.engine.base_port + i
            replica = Supervised(f"replica gpu{gpu}", [], env=replica_env(self.config, gpu),
                                 log_path=self.state_dir / f"replica-gpu{gpu}.log",
                                 new_session=True)
            slot = GpuSlot(gpu, port, replica)
            replica.before_start = lambda _, slot=slot: self._new_boot(slot)
            self.slots.append(slot)

    def _new_boot(self, slot: GpuSlot) -> None:
        """Before every replica start: a new boot id; the worker waits for health."""
        slot.boot_id = uuid.uuid4().hex
        slot.healthy = False
        slot.replica.argv = replica_argv(self.config, slot.gpu, slot.port, slot.boot_id,
                                         self.state_dir / f"requests-gpu{slot.gpu}.jsonl")
        if slot.worker is not None and slot.worker.proc is not None:
            stop_all([slot.worker.proc], self.config.timeouts.shutdown_grace + 30)
        slot.worker = None
        record = {"gpu": slot.gpu, "port": slot.port, "boot_id": slot.boot_id,
                  "started_at": time.time()}
        with (self.state_dir / "boots.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        log.info("replica gpu%d: starting on port %d (boot %s)", slot.gpu, slot.port, slot.boot_id)

    def _worker(self, slot: GpuSlot) -> Supervised:
        return Supervised(
            f"worker gpu{slot.gpu}",
            [cli_exe(), "worker", "--gpu", str(slot.gpu), "--engine-url", slot.url,
             "--boot-id", slot.boot_id, "-c", str(self.config_path)],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": str(slot.gpu)},
            log_path=self.state_dir / f"worker-gpu{slot.gpu}.log", new_session=True)

    def step(self) -> None:
        """Keep every replica running; start (or keep) its worker once it is healthy."""
        from queue_rollout.engines.client import engine_client

        for slot in self.slots:
            slot.replica.keep()
            if (not slot.healthy and slot.replica.proc is not None
                    and engine_client(self.config.engine.kind, slot.url,
                                      timeout=self.health_timeout).healthy()):
                slot.healthy = True
                log.info("replica gpu%d: healthy (boot %s); starting its worker",
                         slot.gpu, slot.boot_id)
                slot.worker = self._worker(slot)
            if slot.healthy and slot.worker is not None:
                slot.worker.keep()
        if self.lineage is not None:
            self.lineage.record([p for s in self.slots for p in
                                 (s.replica.proc, s.worker.proc if s.worker else None)])

    def stop(self, now: threading.Event | None = None) -> None:
        """The workers together (their episodes get ``timeouts.shutdown_grace``), then
        the replicas; once *now* is set, every process still there is killed at once."""
        workers = [s.worker.proc for s in self.slots
                   if s.worker and s.worker.proc and s.worker.proc.poll() is None]
        if workers and not (now and now.is_set()):
            print(f"node: stopping: waiting up to {self.config.timeouts.shutdown_grace} s for "
                  f"the running episodes of {len(workers)} worker"
                  f"{'' if len(workers) == 1 else 's'} to finish; Ctrl-C again to stop now",
                  file=sys.stderr, flush=True)
        stop_all(workers, self.config.timeouts.shutdown_grace + 30, now=now)
        stop_all((s.replica.proc for s in self.slots if s.replica.proc), 30, now=now)
        if now is not None and now.is_set():
            print("node: stopped now: what was running is redone once its leases expire, "
                  "as after a crash", file=sys.stderr, flush=True)


def run_node(config: Config, gpus: list[int], *, stop: threading.Event | None = None,
             poll_s: float = 0.5) -> int:
    stop = stop or threading.Event()
    now = threading.Event()  # a second Ctrl-C: stop every process at once
    stopping = threading.Event()
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, frame: object) -> None:
            if stop.is_set() or stopping.is_set():
                now.set()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    check_replicas(config, gpus)  # refuse bad config now
    state = Path(config.farm.state_dir) / "node"
    with Owner(state / "node.lock",
               f"a node of farm {config.farm.name} is already running on {state}"):
        check_shape(connect_config(config), config)  # and a config the farm does not run
        lineage = Lineage(state)
        lineage.stop_leftovers()  # what a hard stop of the last node here left running
        check_ports(config, gpus)  # and ports another process holds
        node = Node(config, state / "node.toml", gpus, state, lineage=lineage)
        write_node_targets(config, [(s.gpu, s.url) for s in node.slots])  # file_sd
        first = config.engine.base_port
        print(f"node: {len(gpus)} GPU{'' if len(gpus) == 1 else 's'} "
              f"({', '.join(map(str, gpus))}), {config.engine.kind} "
              f"replicas on ports {first}..{first + len(gpus) - 1}; "
              f"boot ids in {state / 'boots.jsonl'}; Ctrl-C stops it", flush=True)
        try:
            while not stop.is_set():
                node.step()
                stop.wait(poll_s)
        finally:
            stopping.set()
            clear_targets(targets_path(config, NODE_FILE))
            node.stop(now)
    print("node: stopped", flush=True)
    return 0
