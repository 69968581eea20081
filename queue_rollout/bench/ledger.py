"""The ledger benchmark: admit/start/finish operations per second from concurrent,
unpipelined clients, against the same clients calling a trivial script (``return 1``)
on the same Redis in the same run: the round-trip floor that no script can beat.

Each client is its own process with its own connection, so the Python GIL does not
serialise the clients. A client cycles through admit (one group), then start and
finish for each of its G attempts; every script call counts as one operation.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from dataclasses import dataclass

import redis

from ..config import RolloutConfig
from ..embedded import EmbeddedRedis
from ..ledger import Ledger

GROUP = 8
FARM = "bench"


@dataclass(frozen=True)
class LedgerBenchResult:
    clients: int
    seconds: float
    ledger_ops: int
    trivial_calls: int

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
            "ledger_ops_per_s": round(self.ledger_ops_per_s, 1),
            "trivial_script_per_s": round(self.trivial_script_per_s, 1),
            "ratio": round(self.ratio, 3),
        }


def _rollout() -> RolloutConfig:
    # Capacity and staleness budget large enough never to block: this measures cost.
    return RolloutConfig(group_size=GROUP, batch_size=1, max_concurrent_samples=10**9,
                         max_staleness=10**9)


def _ledger_client(url: str, index: int, start_at: float, seconds: float, out: mp.Queue) -> None:
    client = redis.Redis.from_url(url)
    ledger = Ledger(client, FARM, _rollout())
    worker = f"bench-{index}"
    while time.time() < start_at:
        time.sleep(0.001)
    ops, deadline = 0, start_at + seconds
    while time.time() < deadline:
        admission = ledger.admit()
        ops += 1
        if admission.status != "admitted":
            break
        for member, aid in enumerate(admission.attempt_ids):
            ledger.start(aid, worker, "replica", "boot", 30)
            ledger.finish(aid, member, b"{}", output_tokens=1)
            ops += 2
    out.put(ops)


def _trivial_client(url: str, index: int, start_at: float, seconds: float, out: mp.Queue) -> None:
    client = redis.Redis.from_url(url)
    script = client.register_script("return 1")
    key = f"bench:{{{FARM}}}:trivial"
    script(keys=[key], args=[index])  # load it before the clock starts
    while time.time() < start_at:
        time.sleep(0.001)
    calls, deadline = 0, start_at + seconds
    while time.time() < deadline:
        script(keys=[key], args=[index])
        calls += 1
    out.put(calls)


def _phase(target, url: str, clients: int, seconds: float) -> int:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    start_at = time.time() + 1.5  # spawn and import before the start line
    procs = [ctx.Process(target=target, args=(url, i, start_at, seconds, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join()
    return total


def run_ledger_bench(*, clients: int = 8, seconds: float = 5.0, prompts: int = 60_000) -> LedgerBenchResult:
    """Both phases against one private redis-server (never a production farm)."""
    with tempfile.TemporaryDirectory(prefix="qr-bench-") as tmp, \
            EmbeddedRedis(tmp, write_url=False, appendfsync="everysec") as server:
        client = redis.Redis.from_url(server.url)
        setup = Ledger(client, FARM, _rollout())
        for start in range(0, prompts, 5000):
            setup.submit((f"p{i}", b"{}") for i in range(start, min(start + 5000, prompts)))
        trivial = _phase(_trivial_client, server.url, clients, seconds)
        ledger = _phase(_ledger_client, server.url, clients, seconds)
        client.close()
    return LedgerBenchResult(clients, seconds, ledger, trivial)
