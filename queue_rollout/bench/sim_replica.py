"""The simulated replica's own cost: one ``queue-rollout sim-engine`` process holding
N concurrent long requests, and the CPU it burns while they decode (it should idle:
progress is computed between events, not per token)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from queue_rollout.ledger.embedded import free_port


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class SimReplicaResult:
    concurrent_requests: int
    seconds: float
    cpu_fraction: float  # of one core, over the measured window

    def as_json(self) -> dict[str, object]:
        return {"profile": "sim-replica", "concurrent_requests": self.concurrent_requests,
                "seconds": self.seconds, "cpu_fraction_of_one_core": round(self.cpu_fraction, 4)}


def run_sim_replica_bench(*, requests: int = 128, seconds: float = 10.0) -> SimReplicaResult:
    from queue_rollout.engines.sglang import EngineError, SGLangClient

    exe = shutil.which("queue-rollout", path=str(Path(sys.executable).parent)) or "queue-rollout"
    port = free_port()
    proc = subprocess.Popen([exe, "sim-engine", "--port", str(port), "--slots", str(requests),
                             "--step-ms", "4.5", "--step-ms-per-request", "0.2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        client = SGLangClient(f"http://127.0.0.1:{port}", timeout=30)
        params = {"max_new_tokens": 1_000_000, "ignore_eos": True}

        def one(i: int) -> None:
            try:
                client.generate(f"bench-{i}", input_ids=[1], sampling_params=params,
                                timeout=seconds + 60)
            except EngineError:
                pass

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while client.server_info()["running"] < requests:
            if time.monotonic() > deadline:
                raise RuntimeError("the sim replica did not take all requests")
            time.sleep(0.1)
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        client.pause("abort")
        for t in threads:
            t.join(10)
    finally:
        proc.terminate()
        proc.wait(10)
    return SimReplicaResult(requests, round(t1 - t0, 2), (cpu1 - cpu0) / (t1 - t0))
