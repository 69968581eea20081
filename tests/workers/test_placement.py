"""Placement end to end: `queue-rollout worker` processes, simulated replicas as their
own processes, the real collector in this process. A replica is down while groups are
placed on its worker's queue: they move to the shared queue and complete elsewhere. Back
under a new boot, it is killed again mid-episode: what ran on it stays in doubt until it
is back. Every group is delivered once and the doctor finds the ledger clean."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from queue_rollout.collector.loop import Collector
from queue_rollout.config import load_config
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.status import farm_status
from queue_rollout.procs import cli_exe
from testkit import wait_for, write_farm

pytestmark = pytest.mark.e2e

GROUPS, G = 24, 4


def write_toml(path: Path, redis_url: str) -> Path:
    return write_farm(
        path, farm={"name": "place", "redis_url": redis_url},
        rollout={"group_size": G, "batch_size": 1, "max_concurrent_samples": 8,
                 "max_staleness": 1000, "placement": "group", "placement_wait_s": 2},
        engine={"slots_per_replica": 4}, collector={"step_ms": 50},
        timeouts={"shutdown_grace": 2, "lease": 3})


def replica(toml: Path, url: str = "") -> tuple[subprocess.Popen, str]:
    url = url or f"http://127.0.0.1:{free_port()}"
    port = url.rsplit(":", 1)[1]
    proc = subprocess.Popen([cli_exe(), "sim-engine", "--port", port, "--slots", "4",
                             "--step-ms", "2", "-c", str(toml)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: SGLangClient(url, timeout=1).healthy(timeout=1), what="replica up")
    return proc, url


def test_a_killed_replica_s_placed_attempts_move_and_every_group_is_delivered_once(
        r, redis_url, tmp_path):
    toml = write_toml(tmp_path / "farm.toml", redis_url)
    config = load_config(toml)
    ledger = Ledger.from_config(r, config)
    replicas = [replica(toml) for _ in range(2)]
    workers = [subprocess.Popen([cli_exe(), "worker", "--gpu", str(i), "--engine-url", url,
                                 "-c", str(toml)], stdout=subprocess.PIPE, text=True)
               for i, (_, url) in enumerate(replicas)]
    stop = threading.Event()
    collector = Collector(ledger, config, name="test-collector")
    thread = collector.start(stop)
    try:
        for w in workers:
            assert w.stdout is not None and "episode slots" in w.stdout.readline()
        doomed_proc, doomed_url = replicas[1]
        doomed_proc.kill()  # down before any work: its worker lives on, taking no job
        doomed_proc.wait()
        ledger.submit((f"g{i:02d}", json.dumps({
            "id": f"g{i:02d}", "input_ids": list(range(i * 1000, i * 1000 + 300)),
            "member_lengths": [150 + 40 * m for m in range(G)]}).encode())
            for i in range(GROUPS))
        # of the first two groups one is placed on each replica: the dead one's waits
        wait_for(lambda: ledger.counters().get("placements:moved", 0) >= 1, 60,
                 "placed attempts moved off the dead replica")
        replicas[1] = replica(toml, doomed_url)

        def running_on_doomed() -> bool:
            return any(a.get("state") == "running" and a.get("replica") == doomed_url
                       for a in map(json.loads, r.hvals(ledger.keys.attempts)))

        wait_for(running_on_doomed, 60, "an episode running on the restarted replica")

        def doubts() -> int:
            return sum(v for k, v in ledger.counters().items() if k.startswith("doubts:"))

        before = doubts()
        replicas[1][0].kill()
        replicas[1][0].wait()
        # what ran there goes into doubt (it may still run): counted, since an attempt its
        # worker started under the boot before is settled at once
        wait_for(lambda: doubts() > before, 60, "doubt")
        delivered: list[str] = []

        def consume() -> None:
            while (d := ledger.pop_batch("trainer")) is not None:
                delivered.extend(d.batch.groups)
                assert ledger.ack("trainer", d.batch.id).status == "acked"

        replicas[1] = replica(toml, doomed_url)
        wait_for(lambda: len(delivered) == GROUPS, 120, "every group delivered", consume)
        status = farm_status(r, config, redis_url=redis_url)
    finally:
        stop.set()
        thread.join(30)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(60)
        for proc, _ in replicas:
            proc.kill()
    assert sorted(delivered) == [f"g{i:02d}" for i in range(GROUPS)]  # each once
    c = ledger.counters()
    assert c.get("failed", 0) == 0 and c.get("reserved", 0) == 0
    assert c["placements:one_replica"] + c.get("placements:split", 0) == GROUPS
    placement = status["placement"]
    assert placement["mode"] == "group" and placement["moved"] == c["placements:moved"] >= 1
    assert examine(r, ledger.keys, 1).ok, examine(r, ledger.keys, 1).problems
    # nothing is left placed or loaded once every attempt has ended
    assert r.zcard(ledger.keys.placed) == 0 and r.hlen(ledger.keys.replica_load) == 0
