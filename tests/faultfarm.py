"""Helpers for the fault tests on real SGLang replicas (``tests/test_real_faults.py``).

- :class:`FaultServer`: a :class:`~real_engine.server.RealServer` that logs every request
  as JSON (``--log-requests-format json``: microsecond timestamps), can be SIGKILLed (its
  whole process group) and started again on the same port.
- :func:`generations` / :func:`overlapping`: every generation the replicas ran, read from
  their own request logs, and the episodes (one sampling seed each) that had two
  generations running at once.
- :func:`generating_processes`: the episode processes under a launcher that hold a
  connection to a replica right now (in the middle of a ``/generate``).
- :class:`UpFarm`: ``queue-rollout up`` against given replicas, with a private
  redis-server (``appendonly yes``, ``appendfsync always``) the test can kill.
- :func:`consume`: the trainer's side, every group, checked against the assignment.
- :class:`Watch`: the farm sampled from a thread while a fault plays out (the ledger's
  counters, the groups in doubt, each replica's running requests and tokens).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import redis
from real_engine.server import RealServer
from real_engine.vllm_server import VLLMServer
from rq import Worker
from rq.serializers import JSONSerializer

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.engines.base import EngineError
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.engines.vllm import VLLMClient
from queue_rollout.errors import BarrierTimeout, RedisUnavailable
from queue_rollout.ledger.embedded import EmbeddedRedis, free_port
from queue_rollout.ledger.records import decode_attempt
from queue_rollout.procs import cli_exe, stop_all
from testkit import alive, metric_sum, process_tree, wait_for, write_farm

#: SGLang's own request log, one JSON object a request received or finished.
REQUEST_LOG_ARGS = ["--log-requests", "--log-requests-level", "1",
                    "--log-requests-format", "json"]
_ABORTED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\].*Abort request obj\.rid='([^']+)'")
#: The episode processes' command line (``workers/supervisor.py``).
EPISODE_PROCESS = "queue_rollout.workers.rq_worker"


class FaultServer(RealServer):
    """A real SGLang server that logs its requests as JSON and can be killed and
    started again on the same port (the farm's config names its URL)."""

    def __init__(self, python: str, model_path: Path, workdir: Path, *, max_running: int,
                 other_weights: Path | None = None) -> None:
        super().__init__(python, model_path, workdir, max_running=max_running,
                         other_weights=other_weights)
        self.args += REQUEST_LOG_ARGS
        self.kills: list[tuple[int, float]] = []  # (log offset, time) of each SIGKILL

    def log_offset(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def kill(self) -> float:
        """SIGKILL to the server's whole process group; returns when."""
        assert self.proc is not None, "the server is not running"
        os.killpg(self.proc.pid, signal.SIGKILL)
        when = time.time()
        self.proc.wait()
        self.proc = None
        self.kills.append((self.log_offset(), when))
        return when

    def restart(self, timeout: float = 300.0) -> None:
        """Start again on the same port (the farm knows this URL)."""
        assert self.proc is None and self.port
        if not self._start_once(timeout):
            raise RuntimeError(f"port {self.port} was taken: the server cannot come back there")

    def ensure_serving(self) -> None:
        """Started again if a test left it dead."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            self.restart()

    @property
    def client(self) -> SGLangClient:
        return SGLangClient(self.url, timeout=10)


# -- what the replicas ran, from their own logs ---------------------------------------


@dataclass
class Generation:
    """One ``/generate`` request that generates (a stop probe, ``max_new_tokens`` 0,
    is none), as the replica logged it."""

    server: str
    rid: str
    seed: int
    max_new_tokens: int
    start: float
    end: float | None = None  # None: still running when the log was read
    how: str = ""  # finish reason, "disconnected" or "killed"
    tokens: int | None = None


#: Episode slots per replica of the two shared replicas (and their
#: ``--max-running-requests``).
SLOTS = 8
#: The two shared replicas while they run (the ``replicas`` fixture's), for a test that
#: needs their memory to stop them.
SHARED_REPLICAS: list[FaultServer] = []


def restore(server: FaultServer) -> None:
    """Undo what a weight-update test may have left: the replica resumed and back on its
    own weights (``default``, the name SGLang gives the weights it started with)."""
    client = server.client
    client.resume()
    info = model_info(server.url)
    if info.get("model_path") != str(server.model_path) or info.get("weight_version") != "default":
        client.update_weights_from_disk(str(server.model_path), weight_version="default")


def stamp(iso: str) -> float:
    """``time.time()`` of a log's local ISO timestamp."""
    return datetime.fromisoformat(iso).timestamp()


class RequestLog(Protocol):
    """A replica's log with its JSON request entries (:data:`REQUEST_LOG_ARGS`) and the
    SIGKILLs it went through: a :class:`FaultServer`, or a replica `node` runs."""

    url: str
    log_path: Path
    kills: list[tuple[int, float]]

    def log_offset(self) -> int: ...


@dataclass
class NodeReplica:
    """A replica `node` launched: its URL, its log, the SIGKILLs the test sent it."""

    url: str
    log_path: Path
    kills: list[tuple[int, float]] = field(default_factory=list)

    def log_offset(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0


def generations(server: RequestLog, since: int = 0) -> list[Generation]:
    """Every generation *server* received after log offset *since*, with when it ended:
    its ``request.finished`` entry, the line saying it was aborted because its client
    went away (second resolution: the end of that second is taken), a SIGKILL of the
    server, or a probe with its rid (``max_new_tokens = 0``) that the server took in:
    SGLang logs a request only once it has refused a duplicate rid, and it forgets a
    rid only when the scheduler has ended its request, so the probe's timestamp bounds
    the end of the generation before it (the disconnect line's second may not)."""
    out: list[Generation] = []
    open_: dict[str, Generation] = {}
    last: dict[str, Generation] = {}  # by rid, the newest generation
    kills = [(offset, when) for offset, when in server.kills if offset > since]
    if not server.log_path.exists():
        return out
    with server.log_path.open("rb") as log:
        log.seek(since)
        offset = since
        for raw in log:
            offset += len(raw)
            while kills and offset > kills[0][0]:
                for g in open_.values():
                    g.end, g.how = kills[0][1], "killed"
                open_.clear()
                kills.pop(0)
            line = raw.decode(errors="replace")
            at = line.find('{"timestamp"')
            if at >= 0:
                try:
                    entry = json.loads(line[at:])
                except ValueError:
                    continue
                rid = str(entry.get("rid"))
                if entry.get("event") == "request.received":
                    params = (entry.get("obj") or {}).get("sampling_params") or {}
                    if params.get("max_new_tokens", 1) and "sampling_seed" in params:
                        g = Generation(server.url, rid, int(params["sampling_seed"]),
                                       int(params.get("max_new_tokens", 0)),
                                       stamp(entry["timestamp"]))
                        open_[rid] = last[rid] = g
                        out.append(g)
                    elif params.get("max_new_tokens") == 0 and rid in last:  # a probe
                        probed, g = stamp(entry["timestamp"]), last[rid]
                        open_.pop(rid, None)
                        if g.end is None or probed < g.end:
                            g.end, g.how = probed, g.how or "stopped (probe taken)"
                elif entry.get("event") == "request.finished" and rid in open_:
                    g = open_.pop(rid)
                    g.end = stamp(entry["timestamp"])
                    meta = (entry.get("out") or {}).get("meta_info") or {}
                    g.how = str((meta.get("finish_reason") or {}).get("type", ""))
                    g.tokens = meta.get("completion_tokens")
                continue
            m = _ABORTED.match(line)
            if m and m.group(2) in open_:
                g = open_.pop(m.group(2))
                g.end, g.how = stamp(m.group(1).replace(" ", "T")) + 1.0, "disconnected"
        if kills:  # killed after the last line
            for g in open_.values():
                g.end, g.how = kills[0][1], "killed"
    return out


def overlapping(gens: list[Generation]) -> list[str]:
    """Episodes (sampling seeds) with two generations running at the same time, on any
    replica: a generation started before the one before it ended (or while it still
    runs)."""
    by_seed: dict[int, list[Generation]] = defaultdict(list)
    for g in gens:
        by_seed[g.seed].append(g)
    problems = []
    for seed, runs in by_seed.items():
        runs.sort(key=lambda g: g.start)
        for first, second in itertools.pairwise(runs):
            if first.end is None or second.start < first.end:
                problems.append(f"seed {seed}: {second.rid} on {second.server} started at "
                                f"{second.start:.3f} while {first.rid} on {first.server} "
                                f"ran ({first.start:.3f} to {first.end})")
    return problems


def _metrics(url: str) -> str | None:
    try:
        return SGLangClient(url).metrics(timeout=2)
    except EngineError:
        return None


def model_info(url: str) -> dict[str, Any]:
    """The replica's ``/model_info`` (its model path and weight version)."""
    with urllib.request.urlopen(f"{url}/model_info", timeout=10) as answer:
        info: dict[str, Any] = json.loads(answer.read())
    return info


def weight_version(url: str) -> str:
    """A vLLM replica's weight version label (its ``/weight_info``, a dev route)."""
    with urllib.request.urlopen(f"{url}/weight_info", timeout=10) as answer:
        return str(json.loads(answer.read())["weight_version"])


@contextlib.contextmanager
def restored(servers: list[VLLMServer], start: Path) -> Iterator[None]:
    """Around a run that updates the weights of vLLM *servers*: after it, each serves
    the weights in *start* again under the label a vLLM starts with."""
    try:
        yield
    finally:
        for server in servers:
            VLLMClient(server.url).update_weights_from_disk(str(start), "default")


def serves(url: str, timeout: float = 5.0) -> bool:
    """A 2-token generation on the replica comes back within *timeout* (a paused
    replica holds it)."""
    try:
        SGLangClient(url).generate(f"serves-{time.monotonic_ns()}", input_ids=[5, 6, 7],
                                   sampling_params={"max_new_tokens": 2, "ignore_eos": True},
                                   timeout=timeout)
    except EngineError:
        return False
    return True


# -- processes --------------------------------------------------------------------------


def cmdline(pid: int) -> str:
    """The command line of process *pid* ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def generating_processes(root: int, port: int) -> list[int]:
    """Episode processes under *root* with a connection open to the replica on *port*
    (one ``/generate`` each, in flight)."""
    sockets: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if int(f[2].rsplit(":", 1)[1], 16) == port and f[3] == "01":  # ESTABLISHED
                    sockets.add(f"socket:[{f[9]}]")
    found = []
    for pid in sorted(process_tree(root)):
        if EPISODE_PROCESS not in cmdline(pid):
            continue
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if links & sockets:
            found.append(pid)
    return found


def kill_all(pids: set[int]) -> None:
    """SIGKILL every process of *pids* (all at once; those already gone ignored)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def replica_pid(root: int, module: str, port: int) -> int:
    """The one process under *root* running *module* (an engine's server) on *port*."""
    found = [pid for pid in process_tree(root)
             if module in (cmd := cmdline(pid)) and f"--port {port} " in cmd]
    assert len(found) == 1, found
    return found[0]


def running_anywhere(module: str, port: int) -> list[int]:
    """Every process on the machine running *module* on *port*."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if module in (cmd := cmdline(pid)) and f"--port {port} " in cmd]


# -- node -------------------------------------------------------------------------------


def registered(client: RolloutClient) -> dict[int, str]:
    """GPU -> the boot id its registered worker runs against."""
    return {w["gpu"]: w["boot"] for w in
            (json.loads(v) for v in client.ledger.client.hgetall(client.ledger.keys.workers)
             .values())}


def new_boot(client: RolloutClient, gpu: int, old: str | None) -> str | None:
    """The boot id *gpu*'s registered worker runs against, once it is not *old*."""
    boot = registered(client).get(gpu)
    return boot if boot not in (None, old) else None


def node_boots(state: Path) -> list[dict[str, Any]]:
    """What ``node`` recorded of each replica start (``<state_dir>/node/boots.jsonl``)."""
    path = state / "node" / "boots.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class NodeRun:
    """``queue-rollout node --gpus GPU -c TOML`` with *env*, its stderr in *log_path*, and
    a collector beside it. :meth:`running` yields node once it says what it starts; on
    the way out the collector stops, node gets SIGTERM, its exit code goes in ``code``
    and every process it had in ``tree`` (whatever is left of them is SIGKILLed, so a
    failed test leaves nothing running)."""

    toml: Path
    gpu: int
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[str] | None = None
    code: int | None = None
    tree: set[int] = field(default_factory=set)

    @contextlib.contextmanager
    def running(self) -> Iterator[subprocess.Popen[str]]:
        with self.log_path.open("ab") as log:
            proc = self.proc = subprocess.Popen(
                [cli_exe(), "node", "--gpus", str(self.gpu), "-c", str(self.toml)],
                stdout=subprocess.PIPE, stderr=log, text=True, env=self.env,
                cwd=self.toml.parent)
            collector: subprocess.Popen[bytes] | None = None
            try:
                assert proc.stdout is not None and "node: 1 GPU" in proc.stdout.readline()
                collector = start_collector(self.toml)
                yield proc
            finally:
                if collector is not None:
                    stop_all([collector], 30)
                self.tree |= process_tree(proc.pid)
                proc.send_signal(signal.SIGTERM)
                try:
                    self.code = proc.wait(120)
                finally:
                    kill_all(self.tree - {proc.pid})

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text()[-chars:]

    def check_stopped(self, client: RolloutClient, server: str, port: int) -> None:
        """After :meth:`running`: node exited 0 with nothing it started left running (its
        replica's *server* module on *port* included) and its worker deregistered."""
        assert self.code == 0, self.log_tail()
        assert alive(self.tree) == set(), [cmdline(pid) for pid in alive(self.tree)]
        assert not running_anywhere(server, port)
        assert registered(client) == {}


def start_collector(toml: Path) -> subprocess.Popen[bytes]:
    """``queue-rollout collector -c TOML``, its stderr in ``collector.log`` beside it."""
    with (toml.parent / "collector.log").open("ab") as log:
        return subprocess.Popen([cli_exe(), "collector", "-c", str(toml)], stderr=log,
                                cwd=toml.parent)


# -- the farm ---------------------------------------------------------------------------


def admission(mode: str, group_size: int, groups_at_once: int) -> dict[str, int]:
    """``[rollout]``'s admission setting: group admission of *groups_at_once* groups, or
    sample refill with that many groups' slots less one member (so groups are admitted
    as members finish)."""
    if mode == "group":
        return {"max_concurrent_rollouts": groups_at_once}
    return {"max_concurrent_samples": groups_at_once * group_size - 1}


#: The AOF policy of a farm whose test kills no Redis: written every second, not fsynced
#: on every write (beside real servers on a loaded CI machine, a client's read of a farm
#: whose Redis fsyncs each write once waited past redis-py's 5 s timeout).
FSYNC = "everysec"
#: Episode slots per replica in a fault farm.
SLOTS = 8


def farm_toml(path: Path, *, name: str, redis_url: str, urls: list[str], mode: str,
              group_size: int = 4, slots: int = SLOTS, groups_at_once: int = 4, lease: int = 3,
              request: int = 600, max_attempts: int = 3, max_failed_members: int = 0,
              pause_mode: str = "in_place", engine_extra: Mapping[str, Any] | None = None,
              batch_size: int = 1, max_staleness: int = 1000,
              workflow: str = "controlled_length", temperature: float = 1.0,
              kind: str = "sglang", doubt: int = 900) -> Path:
    """A farm config at *path* for SGLang replicas at *urls*: groups of *group_size*,
    batches of *batch_size* groups, leases of *lease* s, state beside it; *engine_extra*
    adds ``[engine]`` keys (``node``'s model and launch arguments); the replicas (of
    *kind*) sample at *temperature*."""
    return write_farm(
        path, farm={"name": name, "redis_url": redis_url, "state_dir": path.parent / "state"},
        rollout={"group_size": group_size, "batch_size": batch_size,
                 **admission(mode, group_size, groups_at_once),
                 "max_staleness": max_staleness, "max_attempts": max_attempts},
        timeouts={"lease": lease, "doubt": doubt, "request": request, "shutdown_grace": 2,
                  "leader_lease": 2, "pause_barrier": 60},
        acceptance={"max_failed_members": max_failed_members},
        workflow={"name": workflow, "sampling": {"temperature": temperature}},
        engine={"kind": kind, "urls": urls, "slots_per_replica": slots,
                "threads_per_process": 2, "pause_mode": pause_mode, "deterministic": False,
                **(engine_extra or {})},
        metrics={"port": free_port()})


@dataclass
class UpFarm:
    """``queue-rollout up -c farm.toml`` against running replicas, on a private
    redis-server started here (AOF, *appendfsync* ``always`` unless told otherwise) on a
    free port. Its latency monitor records any event of 200 ms or more: a test that
    fails inside :meth:`running` prints them with the logs' tails."""

    root: Path
    name: str
    urls: list[str]
    mode: str
    settings: dict[str, Any] = field(default_factory=dict)
    appendfsync: str = "always"

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.redis = EmbeddedRedis(self.root / "redis", appendfsync=self.appendfsync,
                                   write_url=False,
                                   extra_args=("--latency-monitor-threshold", "200"))
        self.toml = self.root / "farm.toml"
        self.log_path = self.root / "up.log"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> RolloutClient:
        url = self.redis.start()
        farm_toml(self.toml, name=self.name, redis_url=url, urls=self.urls, mode=self.mode,
                  **self.settings)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([cli_exe(), "up", "-c", str(self.toml)],
                                         stdout=subprocess.PIPE, stderr=log, text=True,
                                         cwd=self.root)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert f"farm {self.name} up" in line, (line, self.log_tail())
        client = RolloutClient.from_config(self.toml)
        # `up` is up once its workers have registered; their episode processes may still
        # be starting. A test that needs episodes on every replica at once submits when
        # every slot listens, so no replica's short episodes end before the other starts.
        slots = len(self.urls) * self.settings.get("slots", SLOTS)
        wait_for(lambda: len(Worker.all(connection=client.ledger.client,
                                        serializer=JSONSerializer)) >= slots,
                 120, f"{slots} episode slots listening", every=0.2)
        return client

    def log_tail(self, lines: int = 40) -> str:
        """The last *lines* of `up`'s own output and of each log its children write
        under ``<state_dir>/logs``."""
        paths = [self.log_path, *sorted((self.root / "state" / "logs").glob("*.log")),
                 self.redis.log_path]
        return "\n".join("\n".join(p.read_text(errors="replace").splitlines()[-lines:])
                         for p in paths if p.exists())

    def redis_latency(self) -> str:
        """Redis's own record of its slow events (``LATENCY LATEST``: event, last time,
        last ms, most ms), or why it could not be read."""
        try:
            return repr(self.redis.client(timeout=5).execute_command("LATENCY", "LATEST"))
        except redis.RedisError as exc:
            return f"LATENCY LATEST not read: {exc}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                code = self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"`up` did not stop on Ctrl-C:\n{self.log_tail()}") from None
            assert code == 0, f"`up` exited {code}:\n{self.log_tail()}"
        self.redis.stop()

    @contextlib.contextmanager
    def running(self) -> Iterator[RolloutClient]:
        try:
            yield self.start()
        except BaseException:  # shown with the failure (pytest prints what a test printed)
            print(f"redis latency events: {self.redis_latency()}\n{self.log_tail()}")
            raise
        finally:
            self.stop()


def doctor(toml: Path) -> str:
    """``queue-rollout doctor -c farm.toml``: must exit 0 and say the ledger is clean;
    returns what it said."""
    proc = subprocess.run([cli_exe(), "doctor", "-c", str(toml)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("doctor: ok (0 slots reserved, 0 groups in flight)"), proc.stdout
    return proc.stdout.strip()


# -- the trainer's side -----------------------------------------------------------------


@dataclass
class Consumed:
    """What the trainer got: group ids in delivery order (a duplicate shows twice),
    members whose output broke the assignment, and the groups never delivered."""

    got: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    failed_members: list[str] = field(default_factory=list)
    versions: list[list[int]] = field(default_factory=list)  # each member's, distinct
    finished_at: float = 0.0  # time.time() when the last group came

    @property
    def duplicated(self) -> int:
        return len(self.got) - len(set(self.got))


def consume(client: RolloutClient, lengths: dict[str, list[int]], *, timeout: float,
            may_fail: frozenset[tuple[str, int]] = frozenset()) -> Consumed:
    """Take and acknowledge batches until every group of *lengths* came (or *timeout*);
    check each member's output against its assigned length. Members in *may_fail*
    (group id, member) may instead have failed (no output)."""
    out = Consumed()
    deadline = time.monotonic() + timeout
    while not set(lengths) <= set(out.got):
        try:
            batch = client.get_batch(timeout=max(0.1, deadline - time.monotonic()))
        except BarrierTimeout:
            break
        for group in batch.groups:
            out.got.append(group.id)
            want = lengths.get(group.id)
            if want is None or len(group.members) != len(want):
                out.wrong.append(f"{group.id}: not submitted, or {len(group.members)} members")
                continue
            for m in group.members:
                out.versions.append(sorted(set(m.versions)))
                if (group.id, m.member) in may_fail and m.finish_reason == "failed":
                    out.failed_members.append(f"{group.id}/{m.member}")
                elif len(m.output_ids) != want[m.member] or m.finish_reason != "length":
                    out.wrong.append(f"{group.id}/{m.member}: {len(m.output_ids)} tokens "
                                     f"({m.finish_reason}), assigned {want[m.member]}")
        client.ack(batch)
    out.finished_at = time.time()
    out.lost = sorted(set(lengths) - set(out.got))
    return out


def settled(client: RolloutClient) -> dict[str, Any] | None:
    """The farm's status once nothing is pending, in flight or ready, no slot is
    reserved and no attempt runs or is in doubt; else None."""
    s = client.status()
    g = s["groups"]
    quiet = (g["pending"] == g["in_flight"] == g["ready"] == 0
             and s["reserved"] == s["active_episodes"] == s["doubtful"] == 0)
    return s if quiet else None


def causes(counters: dict[str, int], prefix: str) -> dict[str, int]:
    """``{cause: n}`` of the ledger's ``<prefix>:<cause>`` counters."""
    return {k.split(":", 1)[1]: v for k, v in sorted(counters.items())
            if k.startswith(prefix + ":") and v}


def record(row: dict[str, Any]) -> None:
    """Print one fault's figures; append them as a JSON line to the file named by
    ``QUEUE_ROLLOUT_FAULT_RESULTS`` when that is set."""
    print("\n" + json.dumps(row), flush=True)
    target = os.environ.get("QUEUE_ROLLOUT_FAULT_RESULTS")
    if target:
        with open(target, "a") as f:
            f.write(json.dumps(row) + "\n")


# -- watching the farm while a fault plays out ----------------------------------------


@dataclass
class Sample:
    """One look at the farm: when (``time.time()``), the ledger's counters (None while
    Redis is away), the episodes in doubt and the groups they belong to, and each
    replica's running requests from its own ``/metrics`` (None when it does not answer)."""

    at: float
    counters: dict[str, int] | None
    doubtful_groups: int
    running: list[float | None]
    generated: list[float | None]  # each replica's sglang:generation_tokens_total

    def total(self, prefix: str) -> int | None:
        """The sum of the ``<prefix>:<cause>`` counters."""
        if self.counters is None:
            return None
        return sum(v for k, v in self.counters.items() if k.startswith(prefix + ":"))


class Watch:
    """Samples the farm (:class:`Sample`) from a thread of its own, every *every* s."""

    def __init__(self, toml: Path, urls: list[str], every: float = 0.5) -> None:
        self.client = RolloutClient.from_config(toml, consumer="watch")
        self.urls, self.every = urls, every
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="watch")
        self._thread.start()

    def _look(self) -> Sample:
        at = time.time()
        counters: dict[str, int] | None
        groups = 0
        ledger = self.client.ledger
        try:
            counters = ledger.counters()
            if counters.get("doubtful", 0):
                groups = len({decode_attempt(raw).group_id for raw in
                              ledger.client.hvals(ledger.keys.attempts)
                              if b'"doubtful"' in raw
                              and decode_attempt(raw).state == "doubtful"})
        except RedisUnavailable:
            counters = None
        texts = [_metrics(u) for u in self.urls]
        return Sample(at, counters, groups,
                      [None if t is None else metric_sum(t, "sglang:num_running_reqs")
                       for t in texts],
                      [None if t is None else metric_sum(t, "sglang:generation_tokens_total")
                       for t in texts])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._look())
            self._stop.wait(self.every)

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(30)
        return self.samples

    def first(self, since: float, holds: Callable[[Sample], bool]) -> float | None:
        """Seconds from *since* to the first sample at or after it for which *holds*."""
        for s in self.samples:
            if s.at >= since and s.counters is not None and holds(s):
                return round(s.at - since, 2)
        return None
