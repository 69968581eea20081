"""kill -9 of Redis mid-run, then a restart from its AOF: workers, the collector and the
trainer's client reconnect and carry on; every group is delivered, the counters agree
with the records (doctor), no slot stays reserved, and every process is still up.

With ``appendfsync always`` nothing acknowledged is lost, so every group is delivered
exactly once. With ``everysec`` (the default) the last second of writes may be lost;
then a group delivered in that second may be delivered again, but none is missing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from queue_rollout import RolloutClient
from queue_rollout.errors import BadInput, RedisUnavailable
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import EmbeddedRedis, free_port
from queue_rollout.procs import Supervised, cli_exe, stop_all
from testkit import wait_for, write_farm

pytestmark = pytest.mark.e2e

GROUPS = 24


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_the_farm_carries_on_across_a_redis_crash_and_restart(tmp_path: Path, appendfsync):
    server = EmbeddedRedis(tmp_path, write_url=False, appendfsync=appendfsync)
    url = server.start()
    toml = write_farm(tmp_path / "farm.toml", farm={"name": "rr", "redis_url": url},
                      rollout={"group_size": 4, "batch_size": 2, "max_concurrent_samples": 8,
                               "max_staleness": 100},
                      engine={"slots_per_replica": 4},
                      timeouts={"shutdown_grace": 2, "lease": 3, "doubt": 20},
                      metrics={"port": free_port()})
    engines = [ThreadedSimEngine(slots=4, step_ms=2.0) for _ in range(2)]
    children = [Supervised(f"worker {i}", [cli_exe(), "worker", "--gpu", str(i), "--engine-url",
                                           e.url, "-c", str(toml)],
                           log_path=tmp_path / f"worker-{i}.log")
                for i, e in enumerate(engines)]
    children.append(Supervised("collector", [cli_exe(), "collector", "-c", str(toml)],
                               log_path=tmp_path / "collector.log"))
    delivered: list[str] = []
    try:
        for child in children:
            child.keep()
        client = RolloutClient.from_config(toml)
        wait_for(lambda: client.status()["workers"]["alive"] == 2, 60, "two workers")
        client.submit([{"id": f"g{i:02d}", "prompt": "x", "member_lengths": [100, 200, 300, 400]}
                       for i in range(GROUPS)])

        def trainer() -> None:
            while len(set(delivered)) < GROUPS:
                batch = client.get_batch(timeout=120)  # rides out the outage itself
                wait_for(lambda b=batch: _acked(client, b), 60, "the ack")
                delivered.extend(g.id for g in batch.groups)

        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        wait_for(lambda: len(delivered) >= 6, 60, "three batches before the crash", every=0.02)
        server.kill()  # kill -9: whatever the AOF has not synced is gone
        time.sleep(2)
        server.restart()
        thread.join(180)
        assert not thread.is_alive(), "the trainer did not get every group after the restart"
        # every process rode it out: none exited (Supervised would have restarted it)
        assert all(c.proc is not None and c.proc.poll() is None and c.restarts == 0
                   for c in children), [(c.name, c.restarts) for c in children]
    finally:
        stop_all((c.proc for c in children if c.proc), 30)
        for engine in engines:
            engine.close()
    assert set(delivered) == {f"g{i:02d}" for i in range(GROUPS)}
    if appendfsync == "always":
        assert len(delivered) == GROUPS  # nothing acknowledged was lost: exactly once
    ledger = client.ledger
    report = examine(ledger.client, ledger.keys, ledger.rollout.batch_size)
    assert report.ok, report.problems
    counters = ledger.counters()
    assert counters.get("reserved", 0) == 0 and counters.get("running", 0) == 0
    assert counters["consumed"] == GROUPS and counters["accepted"] == GROUPS
    server.stop()


def _acked(client: RolloutClient, batch) -> bool:
    """Ack until Redis answers. A refusal means the batch's delivery was among the writes
    the crash lost (everysec): its groups come again in a later batch."""
    try:
        client.ack(batch)
    except RedisUnavailable:
        return False
    except BadInput as exc:
        assert "refused" in str(exc)
    return True
