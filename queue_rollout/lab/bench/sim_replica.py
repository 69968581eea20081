"""The simulated replica's own cost: one ``queue-rollout sim-engine`` process serving
N concurrent requests in a closed loop (each completion replaced at once), with
4,096-token prompts that share long prefixes, all within its KV pool, and the CPU the
process burns over the measured window. Progress is computed between events, not per
token; what it pays for is each request's arrival, prefix match, prefill and end."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass

from queue_rollout.ledger.embedded import free_port
from queue_rollout.procs import cli_exe, spawn, tree_cpu_seconds

#: The closed loop's requests: prompts of PREFIX shared tokens (one of PREFIXES) and
#: UNIQUE tokens of their own, OUTPUT tokens each; 128 of them hold about 207,000 of
#: the default pool's 220,000 tokens.
PREFIXES, PREFIX, UNIQUE, OUTPUT = 8, 3712, 384, 1000
WARMUP_S = 10.0


@dataclass(frozen=True)
class SimReplicaResult:
    concurrent_requests: int
    seconds: float
    cpu_fraction: float  # of one core, over the measured window
    completed: int  # requests completed (and replaced) in the window
    cached_fraction: float  # of the prompt tokens of those, found in the prefix cache
    retracted: int  # requests retracted in the window (none expected: all fit)

    def as_json(self) -> dict[str, object]:
        return {"profile": "sim-replica", "concurrent_requests": self.concurrent_requests,
                "seconds": self.seconds, "cpu_fraction_of_one_core": round(self.cpu_fraction, 4),
                "completed": self.completed, "cached_fraction": round(self.cached_fraction, 4),
                "retracted": self.retracted,
                "prompt_tokens": PREFIX + UNIQUE, "output_tokens": OUTPUT}


def _metrics(url: str) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sglang:"):
            name, value = line.split("{", 1)[0][7:], line.rsplit(" ", 1)[1]
            out[name] = float(value)
    return out


def run_sim_replica_bench(*, requests: int = 128, seconds: float = 60.0) -> SimReplicaResult:
    from queue_rollout.engines.base import EngineError
    from queue_rollout.engines.sglang import SGLangClient

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = spawn([cli_exe(), "sim-engine", "--port", str(port), "--slots", str(requests),
                  "--step-ms", "4.5", "--step-ms-per-request", "0.2"],
                 stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        client = SGLangClient(url, timeout=30)
        params = {"max_new_tokens": OUTPUT, "ignore_eos": True}

        def loop(i: int) -> None:
            prefix = list(range(10_000 * (i % PREFIXES), 10_000 * (i % PREFIXES) + PREFIX))
            n = 0
            while not stop.is_set():
                unique = [100_000_000 + (i * 1000 + n) * UNIQUE + k for k in range(UNIQUE)]
                try:
                    client.generate(f"bench-{i}-{n}", input_ids=prefix + unique,
                                    sampling_params=params, timeout=600)
                except EngineError:
                    return
                n += 1

        threads = [threading.Thread(target=loop, args=(i,), daemon=True)
                   for i in range(requests)]
        for t in threads:
            t.start()
        time.sleep(min(WARMUP_S, seconds))  # the first prefills; the prefixes cached
        before, cpu0, t0 = _metrics(url), tree_cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        after, cpu1, t1 = _metrics(url), tree_cpu_seconds(proc.pid), time.monotonic()
        stop.set()
        client.pause("abort")
        for t in threads:
            t.join(10)
    finally:
        proc.terminate()
        proc.wait(10)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    prompt = delta("prompt_tokens_total")
    return SimReplicaResult(
        requests, round(t1 - t0, 2), (cpu1 - cpu0) / (t1 - t0),
        completed=int(delta("num_requests_total")),
        cached_fraction=delta("cached_tokens_total") / prompt if prompt else 0.0,
        retracted=int(delta("num_retracted_requests_total")))
