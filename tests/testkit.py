"""Helpers for the tests: waiting, trivial prompts, farm configs (written one way: see
:func:`write_farm`), a small `queue-rollout up` farm in the background, free ports,
process trees, a Sentinel-watched primary and replica.
(The manual clock is the virtual farm's: :class:`queue_rollout.lab.virtual.clock.ManualClock`.)"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import redis

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.config import Config, write_config
from queue_rollout.engines.base import Generation
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.errors import RedisUnavailable
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import EmbeddedRedis, find_redis_server, free_port
from queue_rollout.procs import Supervised, cli_exe, stop_all
from queue_rollout.results import EpisodeResult, encode_result

T = TypeVar("T")


def examples(ci: int) -> int:
    """Hypothesis examples for a test that wants *ci* of them in CI: a quarter (at least
    10) under the fast tier's profile (conftest.py)."""
    return ci if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else max(10, ci // 4)


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, what: str = "condition",
             tick: Callable[[], object] | None = None, every: float = 0.1) -> T:
    """Poll *predicate* until it returns something true and return that; fail the test
    (AssertionError naming *what*) after *timeout* seconds. *tick* runs between polls.
    A poll that finds Redis unavailable (a server stalled on a busy disk, or being
    restarted) is no answer yet; if the last poll before the deadline found it so, that
    error is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value, away = predicate(), None
        except RedisUnavailable as exc:
            value, away = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            if away is not None:
                raise away
            raise AssertionError(f"timed out waiting for {what}")
        if tick is not None:
            tick()
        time.sleep(every)


def metric_sum(text: str, name: str) -> float:
    """The sum of every series of metric *name* in a Prometheus text exposition."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))


class Generating:
    """Requests generating on a replica, each in a thread (prompt ``[5, 6, 7, i]``,
    *tokens* with ``ignore_eos``); :meth:`join` returns their answers by rid."""

    def __init__(self, client: SGLangClient, rids: list[str], tokens: int) -> None:
        self.client, self.tokens = client, tokens
        self.answers: dict[str, Generation] = {}
        self.threads = [threading.Thread(target=self._run, args=(rid, i))
                        for i, rid in enumerate(rids)]
        for t in self.threads:
            t.start()

    def _run(self, rid: str, i: int) -> None:
        self.answers[rid] = self.client.generate(
            rid, input_ids=[5, 6, 7, i], timeout=300,
            sampling_params={"max_new_tokens": self.tokens, "ignore_eos": True})

    def join(self, timeout: float = 300) -> dict[str, Generation]:
        for t in self.threads:
            t.join(timeout)
        return self.answers


def greedy(client: SGLangClient, rid: str) -> Generation:
    """24 tokens of greedy decoding (temperature 0, ``ignore_eos``) after ``[5, 6, 7]``."""
    return client.generate(rid, input_ids=[5, 6, 7], timeout=120, sampling_params={
        "max_new_tokens": 24, "ignore_eos": True, "temperature": 0.0})


def running(client: SGLangClient) -> float:
    """``sglang:num_running_reqs`` from the replica's /metrics (both engines export it)."""
    return metric_sum(client.metrics(), "sglang:num_running_reqs")


def trivial_prompts(n: int, prefix: str = "p") -> list[tuple[str, bytes]]:
    """*n* (id, prompt JSON) pairs with ids ``p0``, ``p1``, ..."""
    return [(f"{prefix}{i}", b'{"prompt": "x"}') for i in range(n)]


# -- farm configs ------------------------------------------------------------------------
# One way for a test to write a farm's TOML: its sections as dicts (farm={...},
# rollout={...}, engine={...}, ...), made a Config (an unknown key or a wrong type is
# refused here, by Config's own rules) and written by the package's own writer; the keys
# a test does not give are Config's defaults, written out. The tests of config loading
# itself (malformed, partial or refused TOML) write their text by hand.

#: The sections of a farm config, each a dict of its keys (``workflow``'s ``sampling`` a
#: dict in it); a Path value is written as its str.
Sections = Mapping[str, Mapping[str, Any]]

#: Rollout shapes many tests share: groups of G = 2 members, batches of B = 2 (or 1)
#: groups, sample refill over 8 slots. Add keys with ``{**G2_B2, "max_staleness": 10}``.
G2_B2: dict[str, Any] = {"group_size": 2, "batch_size": 2, "max_concurrent_samples": 8}
G2_B1: dict[str, Any] = {"group_size": 2, "batch_size": 1, "max_concurrent_samples": 8}


def _plain(value: object) -> object:
    """*value* with each Path a str, each mapping a dict, each tuple a list."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def merged(*layers: Sections) -> dict[str, Any]:
    """The sections of *layers* merged key by key, a later layer's value winning (a table
    in a section, ``workflow.sampling``, merged the same way)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            old = out.get(key)
            out[key] = (merged(old, value) if isinstance(old, Mapping)
                        and isinstance(value, Mapping) else value)
    return out


def farm_config(**sections: Mapping[str, Any]) -> Config:
    """The Config of *sections* (``farm={"name": "t"}, rollout={"group_size": 2}``, ...),
    Config's defaults for the rest. Refused (msgspec.ValidationError) as a file would be:
    an unknown section or key, a wrong type, a value out of range; the checks
    `decode_config` adds (a plugin that imports, a pool above one chunk) are left to the
    process that loads the file."""
    return msgspec.convert(_plain(sections), Config)


def write_farm(path: Path, **sections: Mapping[str, Any]) -> Path:
    """Write the farm config of *sections* (as :func:`farm_config`) at *path*, the
    package's way (`config.write_config`: every key, readable by its owner only)."""
    write_config(path, farm_config(**sections))
    return path


def rewrite_farm(path: Path, **sections: Mapping[str, Any]) -> Path:
    """Change the keys *sections* give in the farm config at *path*; keep the rest."""
    return write_farm(path, **merged(tomllib.loads(path.read_text()), sections))


def write_up_farm(path: Path, name: str, state: Path, *, slots: int, metrics_port: int,
                  rollout: Mapping[str, Any], **sections: Mapping[str, Any]) -> Path:
    """A farm config for `up`: 2 sim replicas of *slots* slots each, fast decoding (no
    slowdown per running request), 2 s of shutdown grace; *sections* add or change keys
    (``engine={"pause_mode": "abort"}``)."""
    return write_farm(path, **merged(
        {"farm": {"name": name, "state_dir": state}, "rollout": rollout,
         "engine": {"replicas": 2, "slots_per_replica": slots, "step_ms": 0.5,
                    "step_ms_per_request": 0.0},
         "metrics": {"port": metrics_port}, "timeouts": {"shutdown_grace": 2}},
        sections))


def grpo_sim_farm(tmp_path: Path, name: str, *, group_size: int, batch_size: int) -> Path:
    """The farm a framework trainer's test runs GRPO on: 2 simulated replicas of 3 slots,
    sample refill within one version of staleness, the examples' ``KeyAnswer`` workflow
    (``examples/`` must be on the workers' and the test's path)."""
    return write_up_farm(tmp_path / "farm.toml", name, tmp_path / "state", slots=3,
                         metrics_port=free_port(),
                         rollout={"group_size": group_size, "batch_size": batch_size,
                                  "max_concurrent_samples": 6, "max_staleness": 1},
                         workflow={"name": "grpo_tiny:KeyAnswer"},
                         engine={"step_ms_per_request": 1.0})


def write_node_farm(path: Path, name: str, redis_url: str, *, group_size: int,
                    batch_size: int, **sections: Mapping[str, Any]) -> Path:
    """A farm for a `node --gpus 0-1` and a collector under injected faults: 2 sim
    replicas of 4 slots on free ports, each slot its own episode process (a SIGKILL ends
    one episode), fast decoding, sample refill over 8 slots, a staleness budget never
    reached, 5 attempts an episode, 2 s leases, state beside *path*; *sections* add or
    change keys."""
    return write_farm(path, **merged(
        {"farm": {"name": name, "redis_url": redis_url, "state_dir": path.parent},
         "rollout": {"group_size": group_size, "batch_size": batch_size,
                     "max_concurrent_samples": 8, "max_staleness": 100_000,
                     "max_attempts": 5},
         "engine": {"kind": "sim", "slots_per_replica": 4, "threads_per_process": 1,
                    "step_ms": 0.5, "step_ms_per_request": 0, "base_port": free_ports(2)},
         "timeouts": {"lease": 2, "doubt": 60, "shutdown_grace": 2, "leader_lease": 2},
         "metrics": {"port": free_port()}},
        sections))


@contextlib.contextmanager
def farm_up(toml: Path, *args: str) -> Iterator[str]:
    """`queue-rollout up` (with *args*) in the background, yielding the line it
    announces itself with; Ctrl-C at the end must stop it cleanly."""
    up = subprocess.Popen([cli_exe(), "up", "-c", str(toml), *args], stdout=subprocess.PIPE,
                          text=True)
    try:
        yield up.stdout.readline()
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0


def submit_when_two_workers(toml: Path, keep: Callable[[], object],
                            lengths: dict[str, list[int]]) -> RolloutClient:
    """A trainer client on *toml*'s farm (a `node --gpus 0-1`), once both its workers
    report, with one prompt per entry of *lengths* submitted; *keep* restarts the
    collector if it died."""
    keep()
    client = RolloutClient.from_config(toml)
    wait_for(lambda: client.status()["workers"]["alive"] == 2, 90, "two workers")
    client.submit({"id": gid, "prompt": "x", "member_lengths": m} for gid, m in lengths.items())
    return client


def stop_node_farm(node: subprocess.Popen[bytes], collector: Supervised) -> None:
    """Stop a `node` (SIGTERM: it drains its workers and replicas) and its collector."""
    node.send_signal(signal.SIGTERM)
    try:
        node.wait(90)
    except subprocess.TimeoutExpired:
        node.kill()
    stop_all([collector.proc] if collector.proc else [], 30)


def free_ports(n: int) -> int:
    """A port p with p .. p+n-1 all free just now (node's replica i uses base_port + i)."""
    for _ in range(50):
        base = free_port()
        try:
            for port in range(base, base + n):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")



def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now (from /proc)."""
    parent: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parent[int(p)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parent


def children(pid: int) -> list[int]:
    """The processes whose parent is *pid*."""
    return [child for child, parent in _parents().items() if parent == pid]


def alive(pids: set[int]) -> set[int]:
    """Those of *pids* still running (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def process_tree(root: int) -> set[int]:
    """*root* and every process descending from it."""
    parent = _parents()
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


class EmbeddedSentinel(EmbeddedRedis):
    """A Redis Sentinel (``redis-server sentinel.conf --sentinel``) watching *service*
    at 127.0.0.1:*primary_port*, quick to act: down after 1 s, quorum 2."""

    def __init__(self, state_dir: Path, *, service: str, primary_port: int,
                 down_after_ms: int = 1000, password: str = "") -> None:
        super().__init__(state_dir, write_url=False)
        self.service, self.primary_port, self.down_after_ms = service, primary_port, down_after_ms
        self.password = password

    def client(self, timeout: float = 1.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout,
                           password=self.password or None)

    def command(self) -> list[str]:
        conf = self.data_dir / "sentinel.conf"
        if not conf.exists():  # Sentinel rewrites it: a restart keeps what it learned
            conf.write_text(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.data_dir.resolve()}\n"
                f"logfile {self.log_path.resolve()}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} 5000\n"
                + (f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n"
                   if self.password else ""))
        return [find_redis_server(), str(conf.resolve()), "--sentinel"]


class SentinelSet:
    """A primary, one replica and three Sentinels on loopback; ``url`` is the farm's
    ``redis+sentinel://`` URL. ``primary()`` is whichever node the Sentinels name."""

    SERVICE = "qr"

    def __init__(self, root: Path, *, sentinel_password: str = "") -> None:
        self.nodes = [EmbeddedRedis(root / "a", write_url=False)]
        self.nodes[0].start()
        self.nodes.append(EmbeddedRedis(root / "b", write_url=False, extra_args=(
            "--replicaof", "127.0.0.1", str(self.nodes[0].port))))
        self.nodes[1].start()
        self.sentinels = [EmbeddedSentinel(root / f"s{i}", service=self.SERVICE,
                                           primary_port=self.nodes[0].port,
                                           password=sentinel_password)
                          for i in range(3)]
        for s in self.sentinels:
            s.start()
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        self.url = f"redis+sentinel://{hosts}/{self.SERVICE}"
        wait_for(lambda: self.settled(self.nodes[0].port), 30, "the Sentinels to see the set")

    def _ask(self, sentinel: EmbeddedRedis, *command: str) -> object:
        client = sentinel.client(timeout=1.0)
        try:
            return client.execute_command(*command)
        except redis.RedisError:
            return None
        finally:
            client.close()

    def primary_port(self) -> int | None:
        """The primary's port as the first Sentinel that answers names it."""
        for s in self.sentinels:
            addr = self._ask(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)
            if isinstance(addr, list | tuple) and len(addr) == 2:
                return int(addr[1])
        return None

    def primary(self) -> EmbeddedRedis:
        port = self.primary_port()
        return next(n for n in self.nodes if n.port == port)

    def settled(self, primary_port: int | None = None) -> int | None:
        """The primary's port once every Sentinel names the same node (*primary_port*
        when given) and the other node replicates from it, online; else None. A
        Sentinel may fail over twice (a promoted node starved of CPU past
        down-after-milliseconds is failed over again): without *primary_port* either
        node may end as the primary."""
        named = set()
        for s in self.sentinels:
            addr = self._ask(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)
            if not isinstance(addr, list | tuple) or len(addr) != 2:
                return None
            named.add(int(addr[1]))
        if len(named) != 1 or (primary_port is not None and named != {primary_port}):
            return None
        [port] = named
        primary = next((n for n in self.nodes if n.port == port), None)
        if primary is None:
            return None
        client = primary.client()
        try:
            info = client.info("replication")
        except redis.RedisError:
            return None
        finally:
            client.close()
        online = bool(info.get("role") == "master" and info.get("connected_slaves", 0) >= 1
                      and info.get("slave0", {}).get("state") == "online")
        return port if online else None

    def describe(self) -> str:
        """What each node and Sentinel says, and the Sentinels' last log lines: for a
        test that timed out waiting on the set."""
        lines = []
        for n in self.nodes:
            client = n.client()
            try:
                info = client.info("replication")
                lines.append(f"node {n.port}: role {info.get('role')}, "
                             f"master_port {info.get('master_port')}, "
                             f"link {info.get('master_link_status')}, "
                             f"replicas {info.get('connected_slaves')}")
            except redis.RedisError as exc:
                lines.append(f"node {n.port}: {exc}")
            finally:
                client.close()
        for s in self.sentinels:
            addr = self._ask(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)
            tail = s.log_path.read_text().splitlines()[-5:] if s.log_path.exists() else []
            lines.append(f"sentinel {s.port}: primary {addr}; log: " + " | ".join(tail))
        return "\n".join(lines)

    def stop(self) -> None:
        for proc in [*self.sentinels, *self.nodes]:
            proc.stop()


def write_worker_farm(path: Path, redis_url: str, *, group_size: int, slots: int, lease: int,
                      **sections: Mapping[str, Any]) -> Path:
    """A farm config for :class:`WorkerFarm`: B = 1, room for every group at once;
    *sections* add or change keys."""
    return write_farm(path, **merged(
        {"farm": {"name": "e2e", "redis_url": redis_url},
         "rollout": {"group_size": group_size, "batch_size": 1,
                     "max_concurrent_samples": max(group_size, 8), "max_staleness": 1000},
         "engine": {"slots_per_replica": slots},
         "timeouts": {"shutdown_grace": 2, "lease": lease}},
        sections))


class WorkerFarm:
    """Simulated replicas in this process and one `queue-rollout worker` each; the test
    plays the collector (admission, outbox, reconciler)."""

    def __init__(self, stack: contextlib.ExitStack, toml: Path, replicas: int,
                 step_ms: float) -> None:
        from queue_rollout.config import load_config
        from queue_rollout.lab.sim.server import ThreadedSimEngine

        self.config = load_config(toml)
        self.engines = [stack.enter_context(ThreadedSimEngine(slots=4, step_ms=step_ms))
                        for _ in range(replicas)]
        self.procs = [subprocess.Popen([cli_exe(), "worker", "--gpu", str(i), "--engine-url",
                                        e.url, "-c", str(toml)], stdout=subprocess.PIPE,
                                       text=True)
                      for i, e in enumerate(self.engines)]
        stack.callback(self.stop)
        for p in self.procs:
            assert p.stdout is not None and "episode slots" in p.stdout.readline()

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            assert p.wait(60) == 0


def finish_all(client: RolloutClient,
               versions: tuple[tuple[int, int], ...] = ((0, 3),)) -> None:
    """Play the workers: every queued attempt runs and produces 3 tokens."""
    finish_queued(client.ledger, versions)


def finish_queued(ledger: Ledger, versions: tuple[tuple[int, int], ...] = ((0, 3),)) -> None:
    """Play the workers of *ledger* (a farm's, or a cell's): every queued attempt runs
    and produces 3 tokens, its member's number as its reward."""
    for raw in ledger.client.hkeys(ledger.keys.attempts):
        aid = raw.decode()
        a = ledger.attempt(aid)
        if a.state != "queued":
            continue
        ledger.start(aid, "w", "r", "b", 30)
        result = EpisodeResult(member=a.member, output_ids=[7, 8, 9], logprobs=[-1.0] * 3,
                               version_runs=list(versions), finish_reason="length",
                               reward=float(a.member), tool_ids=[])
        ledger.finish(aid, a.member, encode_result(result), output_tokens=3)


#: A hard restart's groups: four members of 3,000 tokens each, long enough to be running
#: when their launcher is killed.
RESTART_LENGTHS = [3000] * 4


def ride_through_a_hard_restart(toml: Path, kill: Callable[[], set[int]],
                                restart: Callable[[], object], *, groups: int = 8,
                                running: int = 16) -> dict[str, Any]:
    """A trainer rides through a hard restart of its farm's launcher: *groups* groups of
    :data:`RESTART_LENGTHS` are submitted; once *running* episodes run, a trainer thread
    starts taking (and acknowledging) every batch, *kill* SIGKILLs the launcher and
    returns the pids of its tree, and *restart* starts it again and returns once it is
    up. Asserts that none of the old tree was left when the new launcher came up, that
    the trainer (the same client) got every group once with every length exact, that
    every attempt of the old run was retried as its replica's restart and none for
    another cause, and that the ledger is clean. Returns the counters and how long the
    settling took after the restart."""
    trainer = RolloutClient.from_config(toml)
    ids = [f"h{i}" for i in range(groups)]
    trainer.submit({"id": gid, "prompt": "x", "member_lengths": RESTART_LENGTHS} for gid in ids)
    wait_for(lambda: trainer.ledger.counters().get("running", 0) == running, 60,
             f"{running} episodes running")
    got: list[tuple[str, list[int]]] = []
    failed: list[BaseException] = []

    def train() -> None:
        try:
            for _ in ids:  # batches of one group
                batch = trainer.get_batch(timeout=240)
                got.extend((g.id, [len(m.output_ids) for m in g.members]) for g in batch.groups)
                trainer.ack(batch)
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    old = kill()
    restart()
    assert alive(old) == set(), f"the old run's {sorted(alive(old))} outlived the restart"
    back = time.monotonic()
    watch = RolloutClient.from_config(toml)
    settled = wait_for(lambda: (c := watch.ledger.counters()).get(
        "retries:replica_restart", 0) >= running and c, 240,
        "the old run's attempts settled as their replicas' restart")
    settle_s = time.monotonic() - back
    thread.join(240)
    assert not thread.is_alive(), "the trainer got no batch after the restart"
    assert not failed, failed
    assert sorted(gid for gid, _ in got) == ids  # every group, once
    assert all(lengths == RESTART_LENGTHS for _, lengths in got), got
    counters = watch.ledger.counters()
    retries = {k: v for k, v in counters.items() if k.startswith("retries:") and v}
    assert retries == {"retries:replica_restart": running}, retries
    assert counters.get("reserved", 0) == 0 and counters.get("doubtful", 0) == 0, counters
    led = watch.ledger
    assert examine(led.client, led.keys, led.rollout.batch_size).ok
    print(f"\nthe old run's {running} attempts settled {settle_s:.1f} s after the restart "
          f"({settled.get('retries:replica_restart')} retried as replica_restart)", flush=True)
    return {"counters": counters, "settle_s": settle_s}
