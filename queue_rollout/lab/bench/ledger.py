"""The ledger benchmark: admit/start/finish operations per second from concurrent,
unpipelined clients, against the same clients calling a trivial script (``return 1``)
on the same Redis in the same run: the round-trip floor that no script can beat.

Each client is its own process with its own connection, so the Python GIL does not
serialise the clients. A client cycles through admit (one group), then start and
finish for each of its G attempts; every script call counts as one operation. The two
kinds alternate in short segments (trivial, ledger, ledger, trivial, ...) on a shared
schedule, so a change in the machine's background load hits both alike.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import redis

from queue_rollout.config import Placement, RolloutConfig
from queue_rollout.ledger.core import Admission, Ledger
from queue_rollout.ledger.durable import WaitPolicy
from queue_rollout.ledger.embedded import EmbeddedRedis, replica_of
from queue_rollout.procs import die_with_parent

GROUP = 8
FARM = "bench"
GAP_S = 0.2  # idle time between segments


@dataclass(frozen=True)
class LedgerBenchResult:
    clients: int
    seconds: float  # per kind, summed over segments
    ledger_ops: int
    trivial_calls: int
    redis_us_per_call: dict[str, float]
    wait_replicas: int = 0
    placement: str = "any"

    @property
    def ledger_ops_per_s(self) -> float:
        return self.ledger_ops / self.seconds

    @property
    def trivial_script_per_s(self) -> float:
        return self.trivial_calls / self.seconds

    @property
    def ratio(self) -> float:
        return self.ledger_ops_per_s / self.trivial_script_per_s

    def as_json(self) -> dict[str, object]:
        return {
            "profile": "ledger",
            "clients": self.clients,
            "wait_replicas": self.wait_replicas, "placement": self.placement,
            "ledger_ops_per_s": round(self.ledger_ops_per_s, 1),
            "trivial_script_per_s": round(self.trivial_script_per_s, 1),
            "ratio": round(self.ratio, 3),
            "redis_us_per_call": self.redis_us_per_call,
        }


def _rollout(placement: Placement = "any") -> RolloutConfig:
    # Capacity and staleness budget large enough never to block: this measures cost.
    return RolloutConfig(group_size=GROUP, batch_size=1, max_concurrent_samples=10**9,
                         max_staleness=10**9, placement=placement)


def _placeable(ledger: Ledger, worker: str) -> None:
    """A ledger that places groups: *worker* may take any number of them."""
    if ledger.rollout.placement == "group":
        ledger.set_replicas({worker: 10**9})


def segment_kinds(rounds: int) -> list[str]:
    """ABBA order: trivial, ledger, ledger, trivial, ..."""
    pair = ("trivial", "ledger")
    return [k for r in range(rounds) for k in (pair if r % 2 == 0 else pair[::-1])]


def _client(parent: int, url: str, index: int, t0: float, segment_s: float, rounds: int,
            wait_replicas: int, placement: Placement, out: mp.Queue[dict[str, int]]) -> None:
    if not die_with_parent(parent):
        return
    client = redis.Redis.from_url(url)
    ledger = Ledger(client, FARM, _rollout(placement), wait=WaitPolicy(wait_replicas))
    trivial = client.register_script("return 1")
    key = f"bench:{{{FARM}}}:trivial"
    trivial(keys=[key], args=[index])  # loaded before the clock starts
    worker = f"bench-{index}"
    _placeable(ledger, worker)
    counts = {"trivial": 0, "ledger": 0}
    for i, kind in enumerate(segment_kinds(rounds)):
        start = t0 + i * (segment_s + GAP_S)
        deadline = start + segment_s
        while time.time() < start:
            time.sleep(0.0005)
        n = 0
        if kind == "trivial":
            while time.time() < deadline:
                trivial(keys=[key], args=[index])
                n += 1
        else:
            while time.time() < deadline:
                admission = ledger.admit()
                n += 1
                for member, aid in enumerate(admission.attempt_ids):
                    ledger.start(aid, worker, "replica", "boot", 30)
                    ledger.finish(aid, member, b"{}", output_tokens=1)
                    n += 2
        counts[kind] += n
    out.put(counts)


def _evalsha_us(client: redis.Redis) -> float:
    return float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])


def _inner_us(client: redis.Redis) -> float:
    """Microseconds spent in the commands scripts ran, per script call."""
    stats = client.info("commandstats")
    calls = int(stats["cmdstat_evalsha"]["calls"])
    inner = sum(int(v["usec"]) for k, v in stats.items()
                if k not in ("cmdstat_evalsha", "cmdstat_wait", "cmdstat_config|resetstat"))
    return inner / calls


#: Scripts that price one step of a ledger script on the same server: reading a field,
#: a write (copied into the AOF and the replication stream), an attempt record read,
#: decoded, encoded and written back as JSON (as the ledger stores it) and as
#: MessagePack. KEYS[1] = a hash holding the record under ARGV[1] (JSON) and ARGV[2]
#: (MessagePack); KEYS[2] = a counters hash of the probe's own.
PROBES = {
    "read": "return redis.call('HGET', KEYS[1], ARGV[1]) and 1",
    "write": "redis.call('HINCRBY', KEYS[2], 'n', 1) return 1",
    "record_json": "local a = cjson.decode(redis.call('HGET', KEYS[1], ARGV[1])) "
                   "redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(a)) return 1",
    "record_msgpack": "local a = cmsgpack.unpack(redis.call('HGET', KEYS[1], ARGV[2])) "
                      "redis.call('HSET', KEYS[1], ARGV[2], cmsgpack.pack(a)) return 1",
}


def script_costs(url: str, groups: int = 200, wait_replicas: int = 0,
                 placement: Placement = "any") -> dict[str, float]:
    """Redis-side microseconds per call of each script (INFO commandstats), measured
    from one client, one operation kind at a time; ``<op>_commands``: of those, the
    time in the commands the script ran; then the :data:`PROBES`."""
    client = redis.Redis.from_url(url)
    ledger = Ledger(client, "bench-cost", _rollout(placement), wait=WaitPolicy(wait_replicas))
    _placeable(ledger, "cost")
    ledger.submit((f"c{i}", b"{}") for i in range(groups))
    trivial = client.register_script("return 1")
    trivial(keys=["bench:{bench-cost}:trivial"], args=[0])
    costs: dict[str, float] = {}

    def measure(name: str, run: Callable[[], object]) -> None:
        client.config_resetstat()
        run()
        costs[name] = _evalsha_us(client)
        costs[f"{name}_commands"] = _inner_us(client)

    admissions: list[Admission] = []
    measure("admit", lambda: admissions.extend(ledger.admit() for _ in range(groups)))
    measure("start", lambda: [ledger.start(aid, "cost", "replica", "boot", 30)
                              for a in admissions for aid in a.attempt_ids])
    measure("finish", lambda: [ledger.finish(aid, member, b"{}", output_tokens=1)
                               for a in admissions for member, aid in enumerate(a.attempt_ids)])
    if wait_replicas:  # WAIT's own time on the server (its wait for the replica is not)
        costs["wait"] = float(client.info("commandstats")["cmdstat_wait"]["usec_per_call"])
    client.config_resetstat()
    for _ in range(groups * 8):
        trivial(keys=["bench:{bench-cost}:trivial"], args=[0])
    costs["trivial"] = _evalsha_us(client)
    record = msgspec.json.decode(client.hvals(ledger.keys.attempts)[0])  # a finished one
    probe_keys = ["bench:{bench-cost}:records", "bench:{bench-cost}:counters"]
    client.hset(probe_keys[0], mapping={"json": msgspec.json.encode(record),
                                        "msgpack": msgspec.msgpack.encode(record)})
    for name, source in PROBES.items():
        probe = client.register_script(source)
        probe(keys=probe_keys, args=["json", "msgpack"])
        client.config_resetstat()
        for _ in range(groups * 8):
            probe(keys=probe_keys, args=["json", "msgpack"])
        costs[name] = _evalsha_us(client)
    client.close()
    return {k: round(v, 1) for k, v in costs.items()}


def run_ledger_bench(*, clients: int = 8, seconds: float = 6.0, rounds: int = 3,
                     prompts: int = 60_000, wait_replicas: int = 0,
                     placement: Placement = "any") -> LedgerBenchResult:
    """Run against a private redis-server (never a production farm). *seconds* is the
    time per kind, split into *rounds* segments of each. With *wait_replicas*, that
    many private replicas follow it and every ledger change waits for them (WAIT)."""
    segment_s = seconds / rounds
    with tempfile.TemporaryDirectory(prefix="qr-bench-") as tmp, \
            EmbeddedRedis(tmp, write_url=False, appendfsync="everysec") as server, \
            contextlib.ExitStack() as replicas:
        for i in range(wait_replicas):
            replicas.callback(replica_of(server, Path(tmp) / f"replica{i}").stop)
        client = redis.Redis.from_url(server.url)
        setup = Ledger(client, FARM, _rollout())
        for start in range(0, prompts, 5000):
            setup.submit((f"p{i}", b"{}") for i in range(start, min(start + 5000, prompts)))
        client.close()
        ctx = mp.get_context("spawn")
        out: mp.Queue[dict[str, int]] = ctx.Queue()
        t0 = time.time() + 2.0  # spawn and import before the first segment
        procs = [ctx.Process(target=_client,
                             args=(os.getpid(), server.url, i, t0, segment_s, rounds, wait_replicas,
                                   placement, out))
                 for i in range(clients)]
        for p in procs:
            p.start()
        total = 2 * rounds * (segment_s + GAP_S) + 60
        results = [out.get(timeout=total) for _ in procs]
        for p in procs:
            p.join()
        costs = script_costs(server.url, wait_replicas=wait_replicas, placement=placement)
    return LedgerBenchResult(
        clients, seconds,
        ledger_ops=sum(r["ledger"] for r in results),
        trivial_calls=sum(r["trivial"] for r in results),
        redis_us_per_call=costs, wait_replicas=wait_replicas, placement=placement,
    )
