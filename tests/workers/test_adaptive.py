"""Adaptive concurrency end to end: a `queue-rollout worker` process with
``engine.adaptive_slots`` over a simulated replica of its own whose KV pool four long
episodes outgrow, and the real collector in this process. The worker's limit drops
while the pool is full, no running episode is aborted for it, the limit climbs back
once the long episodes are done, and ``"auto"`` capacity follows it in the status."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from queue_rollout.collector.loop import Collector
from queue_rollout.config import load_config
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.status import farm_status
from queue_rollout.procs import cli_exe, stop_all
from testkit import wait_for, write_farm

G, SLOTS, LONG, SHORT = 4, 4, 700, 20


def write_toml(path: Path, redis_url: str) -> Path:
    # four 700-token episodes need 2,800 tokens of a 2,048-token pool
    return write_farm(
        path, farm={"name": "adapt", "redis_url": redis_url},
        rollout={"group_size": G, "batch_size": 1, "max_concurrent_samples": "auto",
                 "max_staleness": 1000},
        engine={"slots_per_replica": SLOTS, "threads_per_process": 2, "adaptive_slots": True,
                "min_slots_per_replica": 1, "adaptive_interval_s": 0.1,
                "max_total_tokens": 2048, "chunked_prefill_size": 512},
        collector={"step_ms": 50}, timeouts={"shutdown_grace": 2, "lease": 3})


@pytest.mark.e2e
def test_a_full_kv_pool_lowers_the_limit_aborts_nothing_and_the_limit_recovers(
        r, redis_url, tmp_path):
    toml = write_toml(tmp_path / "farm.toml", redis_url)
    config = load_config(toml)
    ledger = Ledger.from_config(r, config)
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "requests.jsonl"
    engine = subprocess.Popen([cli_exe(), "sim-engine", "--port", url.rsplit(":", 1)[1],
                               "--slots", str(SLOTS), "--step-ms", "4",
                               "--step-ms-per-request", "0", "--request-log", str(log),
                               "-c", str(toml)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: SGLangClient(url, timeout=1).healthy(timeout=1), what="replica up")
    worker = subprocess.Popen([cli_exe(), "worker", "--gpu", "0", "--engine-url", url,
                               "-c", str(toml)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    thread = Collector(ledger, config, name="test-collector").start(stop)
    seen: list[tuple[float, int, int]] = []  # (when, the worker's limit, capacity)
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            s = farm_status(r, config, redis_url=redis_url)
            limits = s["workers"]["limits"]
            if limits:
                seen.append((time.monotonic(), next(iter(limits.values())), s["capacity"]))
            watching.wait(0.05)

    watcher = threading.Thread(target=watch)
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert "episode slots (adaptive: 1 to 4 take jobs)" in line, line
        watcher.start()
        prompts = [("long", [LONG] * G)] + [(f"short{i}", [SHORT] * G) for i in range(4)]
        ledger.submit((pid, json.dumps({"id": pid, "prompt": pid,
                                        "member_lengths": lengths}).encode())
                      for pid, lengths in prompts)
        delivered: list[str] = []

        def consume() -> bool:
            while (d := ledger.pop_batch("trainer")) is not None:
                delivered.extend(d.batch.groups)
                assert ledger.ack("trainer", d.batch.id).status == "acked"
            return len(delivered) == len(prompts)

        wait_for(consume, 120, "every group delivered")
        wait_for(lambda: seen and seen[-1][1:] == (SLOTS, SLOTS), 30, "the limit back at 4")
        status = subprocess.run([cli_exe(), "status", "--json", "-c", str(toml)],
                                capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        s = json.loads(status.stdout)
        assert list(s["workers"]["limits"].values()) == [SLOTS] and s["capacity"] == SLOTS
    finally:
        watching.set()
        if watcher.is_alive():
            watcher.join()
        stop.set()
        thread.join(10)
        stop_all([worker, engine], 20)
    assert sorted(delivered) == sorted(pid for pid, _ in prompts)
    assert all(capacity == limit for _, limit, capacity in seen), seen  # "auto" follows it
    # the limit dropped while the long episodes filled the pool, and was whole again
    # once they had ended
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    long_ = [q for q in requests if q["tokens"] == LONG]
    dropped = [t for t, limit, _ in seen if limit < SLOTS]
    assert dropped, seen
    assert min(q["started"] for q in long_) < dropped[0] < max(q["ended"] for q in long_)
    whole = [t for t, limit, _ in seen if limit == SLOTS and t > dropped[-1]]
    assert whole and whole[0] >= min(q["ended"] for q in long_)
    # nothing was aborted or retried: each episode ran once, to its full length
    ran = [q for q in requests if q["tokens"] > 0]
    assert sorted(q["tokens"] for q in ran) == sorted(n for _, ls in prompts for n in ls)
    assert all(q["finish"] == "length" for q in ran), [q for q in ran if q["finish"] != "length"]
    counters = ledger.counters()
    assert not {k: v for k, v in counters.items() if k.startswith("retries")}, counters
    assert counters["finished"] == G * len(prompts)
    _, err = worker.communicate(timeout=10)
    assert re.search(r"limit 4 -> [123] slots \(token usage", err), err[-2000:]
