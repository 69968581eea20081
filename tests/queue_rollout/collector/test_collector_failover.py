"""kill -9 of the leading collector mid-run (a standby takes over, or it is restarted):
every group delivered once, counters exact, doctor clean. And "auto" capacity."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queue_rollout import RolloutClient
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import free_port
from testkit import write_farm

pytestmark = pytest.mark.e2e

EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("recovery", ["standby", "restart"])
def test_the_leader_killed_mid_run_is_replaced(tmp_path, redis_url, r, recovery):
    farm = {"farm": {"name": "fo", "redis_url": redis_url},
            "rollout": {"group_size": 2, "batch_size": 2, "max_concurrent_samples": 4,
                        "max_staleness": 100},
            "engine": {"slots_per_replica": 2},
            "timeouts": {"leader_lease": 1, "shutdown_grace": 2}}
    toml = write_farm(tmp_path / "farm.toml", **farm)
    procs: list[subprocess.Popen] = []

    def spawn(*args: str, port: int | None = None) -> subprocess.Popen:
        cfg = toml
        if port is not None:  # each collector serves metrics on its own port
            cfg = write_farm(tmp_path / f"farm-{port}.toml", **farm, metrics={"port": port})
        proc = subprocess.Popen([EXE, *args, "-c", str(cfg)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        proc.stdout.readline()
        return proc

    client = RolloutClient.from_config(toml)
    with ThreadedSimEngine(slots=2, step_ms=1.0) as engine:
        try:
            spawn("worker", "--gpu", "0", "--engine-url", engine.url)
            leader = spawn("collector", port=free_port())
            if recovery == "standby":
                time.sleep(0.5)
                spawn("collector", port=free_port())  # waits for the leader's lease
            client.submit([{"id": f"g{i:02d}", "prompt": "x", "member_lengths": [100, 300]}
                           for i in range(16)])
            delivered = []
            for k in range(8):
                batch = client.get_batch(timeout=120)
                delivered += [g.id for g in batch.groups]
                assert all(len(m.output_ids) == (100, 300)[m.member]
                           for g in batch.groups for m in g.members)
                client.ack(batch)
                if k == 2:
                    os.kill(leader.pid, signal.SIGKILL)
                    leader.wait(5)
                    if recovery == "restart":
                        spawn("collector", port=free_port())
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(60)
    assert sorted(delivered) == [f"g{i:02d}" for i in range(16)]  # each once
    c = client.ledger.counters()
    assert (c["admitted"], c["accepted"], c["consumed"], c["finished"]) == (16, 16, 16, 32)
    assert (c["reserved"], c.get("in_flight", 0)) == (0, 0)
    assert examine(r, client.ledger.keys, client.ledger.rollout.batch_size).ok
    assert client.status()["groups"]["consumed"] == 16


def test_auto_capacity_grows_when_a_third_worker_joins(tmp_path, redis_url, r):
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "auto", "redis_url": redis_url},
                      rollout={"group_size": 2, "batch_size": 1,
                               "max_concurrent_samples": "auto", "max_staleness": 100},
                      engine={"slots_per_replica": 2}, metrics={"port": free_port()},
                      timeouts={"shutdown_grace": 2})
    client = RolloutClient.from_config(toml)
    procs: list[subprocess.Popen] = []

    def spawn(*args: str) -> None:
        proc = subprocess.Popen([EXE, *args, "-c", str(toml)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        proc.stdout.readline()

    def wait_status(pred, what: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while not pred(s := client.status()):
            assert time.monotonic() < deadline, f"{what}: {s}"
            time.sleep(0.1)
        return s

    engines = [ThreadedSimEngine(slots=2, step_ms=2.0) for _ in range(3)]
    try:
        for gpu in (0, 1):
            spawn("worker", "--gpu", str(gpu), "--engine-url", engines[gpu].url)
        spawn("collector")
        client.submit([{"id": f"a{i:02d}", "prompt": "x", "member_lengths": [5000, 5000]}
                       for i in range(12)])  # 10 s episodes: slots stay busy
        wait_status(lambda s: s["capacity"] == 4 and s["active_episodes"] == 4, "two workers")
        assert client.status()["reserved"] == 4
        spawn("worker", "--gpu", "2", "--engine-url", engines[2].url)
        s = wait_status(lambda s: s["capacity"] == 6 and s["active_episodes"] == 6,
                        "the third worker's slots in use")
        assert (s["workers"]["alive"], s["workers"]["slots"]) == (3, 6) and s["reserved"] == 6
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
        for engine in engines:
            engine.close()
