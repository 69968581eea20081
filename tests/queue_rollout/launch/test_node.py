"""`queue-rollout node --gpus ...`: a replica and a worker per GPU, boot ids, restarts,
clean shutdown; with simulated replicas and with a stand-in for SGLang's launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
from pathlib import Path

import pytest

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.collector.loop import Collector
from queue_rollout.config import load_config
from queue_rollout.errors import ConfigError
from queue_rollout.launch.node import parse_gpus
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.records import decode_attempt
from queue_rollout.procs import cli_exe
from testkit import free_ports, wait_for


def test_gpu_lists():
    assert parse_gpus("0-7") == list(range(8))
    assert parse_gpus("0,2,5") == [0, 2, 5]
    assert parse_gpus("0-3,6, 2") == [0, 1, 2, 3, 6]
    with pytest.raises(ConfigError, match="not a list of GPU indices"):
        parse_gpus("gpu0")
    with pytest.raises(ConfigError, match="runs backwards"):
        parse_gpus("3-1")





def write_farm(tmp_path: Path, redis_url: str, engine: str) -> Path:
    path = tmp_path / "farm.toml"
    path.write_text(textwrap.dedent(f"""\
        [farm]
        name = "nd"
        redis_url = "{redis_url}"
        state_dir = "{tmp_path / 'state'}"
        [rollout]
        group_size = 2
        batch_size = 1
        max_concurrent_samples = 4
        max_staleness = 100
        [timeouts]
        shutdown_grace = 2
        lease = 3
        [engine]
        slots_per_replica = 2
        base_port = {free_ports(2)}
        {engine}
        """))
    return path


def boots(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "node" / "boots.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def registered(r) -> dict[int, str]:
    """GPU -> the boot id its registered worker runs against."""
    return {w["gpu"]: w["boot"] for w in
            (json.loads(v) for v in r.hgetall(Keys("nd").workers).values())}


def pids_with(*texts: str) -> list[int]:
    """Processes whose command line holds every one of *texts*."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if all(t in cmd for t in texts):
                out.append(int(pid))
    return out


def attempts(client: RolloutClient) -> list:
    return [(aid.decode(), decode_attempt(raw)) for aid, raw in
            client.ledger.client.hgetall(client.ledger.keys.attempts).items()]


def start_node(toml: Path, gpus: str, env: dict | None = None) -> subprocess.Popen:
    # from the farm's folder: `python -m` puts the working directory on sys.path, and a
    # source checkout there would shadow the installed package
    proc = subprocess.Popen([cli_exe(), "node", "--gpus", gpus, "-c", str(toml)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=toml.parent)
    assert proc.stdout is not None and "node: 2 GPUs" in proc.stdout.readline()
    return proc


@pytest.mark.e2e
def test_sim_node_runs_episodes_restarts_a_dead_replica_under_a_new_boot_and_stops(
        tmp_path, redis_url, r):
    """Replica gpu0 is killed with episodes in flight: node restarts it under a new boot
    id and its worker with it; the worker settles the old boot's attempts as stopped
    (the boot changed) and runs them again; every group comes out whole."""
    toml = write_farm(tmp_path, redis_url, 'kind = "sim"\nstep_ms = 1.0')
    node = start_node(toml, "0-1")
    stop = threading.Event()
    try:
        wait_for(lambda: len(registered(r)) == 2, 60, "two workers registered")
        first = {b["gpu"]: b["boot_id"] for b in boots(tmp_path)}
        assert registered(r) == first  # each worker runs against its replica's boot

        config = load_config(toml)
        client = RolloutClient.from_config(config)
        collector = Collector(client.ledger, config, name="test")
        collector.start(stop)
        client.submit([{"id": f"p{i}", "prompt": "x", "member_lengths": [20, 40]}
                       for i in range(4)])
        for _ in range(4):
            batch = client.get_batch(timeout=60)
            assert [len(m.output_ids) for m in batch.groups[0].members] == [20, 40]
            client.ack(batch)

        # long episodes (3 s), so that replica gpu0 dies with some of them in flight
        client.submit([{"id": f"q{i}", "prompt": "x", "member_lengths": [3000, 3000]}
                       for i in range(4)])
        on_gpu0 = wait_for(lambda: [aid for aid, a in attempts(client) if a.state == "running"
                                    and a.worker.endswith("-gpu0")], 30, "episodes on gpu0")
        victim = pids_with("sim-engine", f"--boot-id {first[0]}")
        assert len(victim) == 1
        os.kill(victim[0], signal.SIGKILL)  # replica gpu0 dies
        wait_for(lambda: len(boots(tmp_path)) == 3, 60, "a new boot for gpu0")
        new_boot = boots(tmp_path)[-1]
        assert new_boot["gpu"] == 0 and new_boot["boot_id"] != first[0]
        # its worker is restarted against the new boot; gpu1's is left alone
        wait_for(lambda: registered(r).get(0) == new_boot["boot_id"], 60, "worker re-pinned")
        assert registered(r)[1] == first[1]
        for _ in range(4):  # the killed episodes ran again: every group whole
            batch = client.get_batch(timeout=90)
            assert [len(m.output_ids) for m in batch.groups[0].members] == [3000, 3000]
            client.ack(batch)
        counters = client.ledger.counters()
        assert counters.get("retries:replica_restart", 0) >= 1, counters
        assert counters["consumed"] == 8 and counters.get("reserved", 0) == 0
        led = client.ledger
        assert examine(led.client, led.keys, led.rollout.batch_size).ok
        assert on_gpu0
    finally:
        stop.set()
        node.send_signal(signal.SIGTERM)
        assert node.wait(90) == 0
    assert pids_with(str(tmp_path)) == []  # no worker left behind (their -c is here)
    assert all(pids_with(f"--boot-id {b['boot_id']}") == [] for b in boots(tmp_path))
    assert r.hlen(Keys("nd").workers) == 0  # they deregistered on the way out


STAND_IN = '''\
"""A stand-in for `python -m sglang.launch_server`: records how it was launched, then
serves the simulated replica on the given port (reporting no boot id, as SGLang)."""
import asyncio, json, os, sys
from pathlib import Path

args = sys.argv[1:]
record = Path(os.environ["STAND_IN_RECORD"]) / f"gpu{os.environ['CUDA_VISIBLE_DEVICES']}.json"
record.write_text(json.dumps({"argv": args, "cuda": os.environ["CUDA_VISIBLE_DEVICES"]}))

from queue_rollout.engines.sim_server import SimEngineServer
from queue_rollout.engines.sim_model import SimModel

async def main():
    model = SimModel(slots=int(args[args.index("--max-running-requests") + 1]),
                     step_ms=1.0, step_ms_per_request=0.0)
    server = SimEngineServer(model, port=int(args[args.index("--port") + 1]))
    server.boot_id = ""
    await server.start()
    await server.serve_forever()

asyncio.run(main())
'''


@pytest.mark.e2e
def test_sglang_replicas_are_launched_pinned_with_the_documented_arguments(
        tmp_path, redis_url, r):
    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    (fake / "sglang" / "launch_server.py").write_text(STAND_IN)
    record = tmp_path / "record"
    record.mkdir()
    toml = write_farm(tmp_path, redis_url, 'kind = "sglang"\nmodel_path = "/models/policy"\n'
                      'deterministic = true\nsglang_args = ["--mem-fraction-static", "0.8"]')
    base = load_config(toml).engine.base_port
    env = {**os.environ, "PYTHONPATH": str(fake), "STAND_IN_RECORD": str(record)}
    node = start_node(toml, "3,5", env)
    try:
        wait_for(lambda: len(registered(r)) == 2, 60, "two workers registered")
        booted = {b["gpu"]: b["boot_id"] for b in boots(tmp_path)}
        assert registered(r) == booted and set(booted) == {3, 5}
        for i, gpu in enumerate((3, 5)):
            launched = json.loads((record / f"gpu{gpu}.json").read_text())
            assert launched["cuda"] == str(gpu)
            assert launched["argv"] == [
                "--model-path", "/models/policy", "--host", "127.0.0.1", "--port",
                str(base + i), "--enable-metrics", "--max-running-requests", "2",
                "--enable-deterministic-inference", "--mem-fraction-static", "0.8"]
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(90) == 0
    assert pids_with("sglang.launch_server", str(base)) == []


def test_sglang_without_a_model_is_refused(tmp_path, redis_url):
    toml = write_farm(tmp_path, redis_url, 'kind = "sglang"')
    proc = subprocess.run([cli_exe(), "node", "--gpus", "0", "-c", str(toml)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "engine.model_path" in proc.stderr
