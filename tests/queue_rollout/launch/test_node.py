"""`queue-rollout node --gpus ...`: a replica and a worker per GPU, boot ids, restarts,
clean shutdown; with simulated replicas and with a stand-in for SGLang's launcher. A real
SGLang replica under node, SIGKILLed with episodes on it, is in ``tests/test_real_faults.py``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from queue_rollout.client.rollout import RolloutClient
from queue_rollout.collector.loop import Collector
from queue_rollout.config import Config, EngineConfig, load_config
from queue_rollout.errors import ConfigError
from queue_rollout.launch.node import (
    SGLANG_PYTHON_ENV,
    VLLM_PYTHON_ENV,
    check_engine_python,
    check_ports,
    engine_python,
    parse_gpus,
    replica_argv,
    replica_env,
)
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.records import decode_attempt
from queue_rollout.procs import cli_exe
from testkit import (
    alive,
    free_ports,
    merged,
    process_tree,
    ride_through_a_hard_restart,
    wait_for,
    write_farm,
)


def test_gpu_lists():
    assert parse_gpus("0-7") == list(range(8))
    assert parse_gpus("0,2,5") == [0, 2, 5]
    assert parse_gpus("0-3,6, 2") == [0, 1, 2, 3, 6]
    with pytest.raises(ConfigError, match="not a list of GPU indices"):
        parse_gpus("gpu0")
    with pytest.raises(ConfigError, match="runs backwards"):
        parse_gpus("3-1")


def sglang_config(*args: str, **engine: object) -> Config:
    return Config(engine=EngineConfig(kind="sglang", model_path="/models/policy",
                                      sglang_args=list(args), **engine))  # type: ignore[arg-type]


def test_sglang_runs_under_engine_python_else_the_environment_variable_else_this_python(
        monkeypatch):
    monkeypatch.delenv(SGLANG_PYTHON_ENV, raising=False)
    assert engine_python(EngineConfig()) == sys.executable
    monkeypatch.setenv(SGLANG_PYTHON_ENV, "/venvs/sglang/bin/python")
    assert engine_python(EngineConfig()) == "/venvs/sglang/bin/python"
    config = sglang_config(python="/opt/sglang/bin/python")
    assert engine_python(config.engine) == "/opt/sglang/bin/python"  # the key wins
    assert replica_argv(config, 0, 30000, "b")[:3] == [
        "/opt/sglang/bin/python", "-m", "sglang.launch_server"]


def test_a_python_without_sglang_is_refused_naming_it_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv(SGLANG_PYTHON_ENV, raising=False)
    if find_spec("sglang") is not None:
        pytest.skip("this Python has SGLang")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with pytest.raises(ConfigError) as refused:
        check_engine_python(EngineConfig(kind="sglang"), env)
    assert str(refused.value) == (
        f"engine.python: {sys.executable} (node's own Python: neither engine.python nor "
        f"{SGLANG_PYTHON_ENV} is set) cannot import sglang: install SGLang for that Python, "
        f"or set engine.python (or the environment variable {SGLANG_PYTHON_ENV}) to a "
        "Python that has it")
    monkeypatch.setenv(SGLANG_PYTHON_ENV, sys.executable)
    with pytest.raises(ConfigError, match=f"\\({SGLANG_PYTHON_ENV}\\) cannot import sglang"):
        check_engine_python(EngineConfig(kind="sglang"), env)
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(ConfigError, match=f"{missing} \\(engine.python\\) cannot be run"):
        check_engine_python(EngineConfig(kind="sglang", python=missing), env)
    (tmp_path / "sglang").mkdir()  # with a package named sglang on its path, it passes
    (tmp_path / "sglang" / "__init__.py").write_text("")
    check_engine_python(EngineConfig(kind="sglang"), {**env, "PYTHONPATH": str(tmp_path)})


def test_a_cpu_server_gets_sglang_use_cpu_engine_and_the_rest_of_the_environment(
        monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/stand/in")
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    for args in (["--device", "cpu"], ["--device=cpu"], ["--device", "cuda", "--device", "cpu"]):
        env = replica_env(sglang_config(*args, deterministic=False), 3)
        assert env["SGLANG_USE_CPU_ENGINE"] == "1", args
        assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PYTHONPATH"] == "/stand/in"
    for config in (sglang_config("--device", "cuda"), sglang_config("--mem-fraction-static", "0.8"),
                   Config(engine=EngineConfig(kind="sim", sglang_args=["--device", "cpu"]))):
        assert "SGLANG_USE_CPU_ENGINE" not in replica_env(config, 3)


def test_deterministic_inference_on_a_cpu_server_is_refused_not_dropped():
    with pytest.raises(ConfigError, match=r"^engine.deterministic: a CPU server .* refuses "
                       r"--enable-deterministic-inference.*torch-native attention; set "
                       r"engine.deterministic = false"):
        replica_argv(sglang_config("--device", "cpu"), 0, 30000, "b")
    argv = replica_argv(sglang_config("--device", "cpu", deterministic=False), 0, 30000, "b")
    assert "--enable-deterministic-inference" not in argv and argv[-2:] == ["--device", "cpu"]


def test_a_vllm_replica_runs_its_server_on_loopback_with_the_dev_routes(monkeypatch,
                                                                        tmp_path):
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setenv(SGLANG_PYTHON_ENV, "/venvs/sglang/bin/python")  # not vLLM's
    config = Config(engine=EngineConfig(kind="vllm", model_path="/models/policy",
                                        slots_per_replica=64, pause_mode="abort",
                                        vllm_args=["--dtype", "float32"]))
    assert replica_argv(config, 2, 30002, "b") == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
        "/models/policy", "--host", "127.0.0.1", "--port", "30002", "--enable-scale-out",
        "--max-num-seqs", "64", "--dtype", "float32"]
    monkeypatch.setenv(VLLM_PYTHON_ENV, "/venvs/vllm/bin/python")
    assert engine_python(config.engine) == "/venvs/vllm/bin/python"
    env = replica_env(config, 2)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "2"
    assert "VLLM_SERVER_DEV_MODE" not in replica_env(sglang_config(), 2)
    with pytest.raises(ConfigError, match=r'engine\.model_path: `node` with engine\.kind = "vllm"'):
        replica_argv(Config(engine=EngineConfig(kind="vllm", pause_mode="abort")), 0, 1, "b")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    monkeypatch.setenv(VLLM_PYTHON_ENV, sys.executable)
    if find_spec("vllm") is None:
        with pytest.raises(ConfigError, match=f"\\({VLLM_PYTHON_ENV}\\) cannot import vllm: "
                                              "install vLLM for that Python"):
            check_engine_python(EngineConfig(kind="vllm"), env)
    (tmp_path / "vllm").mkdir()  # with a package named vllm on its path, it passes
    (tmp_path / "vllm" / "__init__.py").write_text("")
    check_engine_python(EngineConfig(kind="vllm"), {**env, "PYTHONPATH": str(tmp_path)})


def node_farm(tmp_path: Path, redis_url: str, **changes: dict) -> Path:
    """Farm nd's config for a node: replicas of 2 slots on free ports; *changes* change or
    add keys (``engine={"kind": "sim"}``)."""
    return write_farm(tmp_path / "farm.toml", **merged(
        {"farm": {"name": "nd", "redis_url": redis_url, "state_dir": tmp_path / "state"},
         "rollout": {"group_size": 2, "batch_size": 1, "max_concurrent_samples": 4,
                     "max_staleness": 100},
         "timeouts": {"shutdown_grace": 2, "lease": 3},
         "engine": {"slots_per_replica": 2, "base_port": free_ports(2)}},
        changes))


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


def start_node(toml: Path, gpus: str, env: dict | None = None, **popen) -> subprocess.Popen:
    # from the farm's folder: `python -m` puts the working directory on sys.path, and a
    # source checkout there would shadow the installed package
    proc = subprocess.Popen([cli_exe(), "node", "--gpus", gpus, "-c", str(toml)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=toml.parent, **popen)
    line = proc.stdout.readline() if proc.stdout is not None else ""
    n = len(parse_gpus(gpus))
    assert f"node: {n} GPU{'' if n == 1 else 's'} (" in line, line
    return proc


@pytest.mark.e2e
def test_sim_node_runs_episodes_restarts_a_dead_replica_under_a_new_boot_and_stops(
        tmp_path, redis_url, r):
    """Replica gpu0 is killed with episodes in flight: node restarts it under a new boot
    id and its worker with it; the worker settles the old boot's attempts as stopped
    (the boot changed) and runs them again; every group comes out whole."""
    toml = node_farm(tmp_path, redis_url, engine={"kind": "sim", "step_ms": 1.0})
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


@pytest.mark.e2e
def test_node_killed_hard_with_episodes_running_comes_back_and_settles_them_as_restarts(
        tmp_path, redis_url, r):
    """`node --gpus 0-1` (simulated replicas of 8 slots, sample refill) with 16 episodes
    of 3,000 tokens running is SIGKILLed and started again, with a doubt timeout of an
    hour: nothing of the old node is left when the new one starts, its replicas come
    back under new boot ids, and its workers settle what the old boots ran as the
    replicas' restart; the trainer, waiting since before the kill, gets every group."""
    toml = node_farm(tmp_path, redis_url, engine={"kind": "sim", "step_ms": 2.0,
                                                  "slots_per_replica": 8},
                     rollout={"group_size": 4, "max_concurrent_samples": 16},
                     timeouts={"doubt": 3600})
    config = load_config(toml)
    stop = threading.Event()
    Collector(Ledger.from_config(r, config), config, name="test").start(stop)
    nodes = [start_node(toml, "0-1")]

    def kill() -> set[int]:
        tree = process_tree(nodes[-1].pid)
        os.kill(nodes[-1].pid, signal.SIGKILL)
        nodes[-1].wait()
        return tree

    def restart() -> None:
        nodes.append(start_node(toml, "0-1"))
        wait_for(lambda: len(registered(r)) == 2 and set(registered(r).values())
                 == {b["boot_id"] for b in boots(tmp_path)[-2:]}, 60,
                 "both workers against their replicas' new boots")

    try:
        wait_for(lambda: len(registered(r)) == 2, 60, "two workers registered")
        ride_through_a_hard_restart(toml, kill, restart)
        assert len(boots(tmp_path)) == 4  # two boots each, the second after the kill
    finally:
        stop.set()
        for node in nodes:
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
                node.wait(90)
    assert nodes[-1].returncode == 0


STAND_IN = '''\
"""A stand-in for `python -m sglang.launch_server`: records how it was launched, then
serves the simulated replica on the given port (reporting no boot id, as SGLang)."""
import asyncio, json, os, sys
from pathlib import Path

args = sys.argv[1:]
record = Path(os.environ["STAND_IN_RECORD"]) / f"gpu{os.environ['CUDA_VISIBLE_DEVICES']}.json"
record.write_text(json.dumps({"argv": args, "cuda": os.environ["CUDA_VISIBLE_DEVICES"]}))

from queue_rollout.lab.sim.server import SimEngineServer
from queue_rollout.lab.sim.model import SimModel

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
    toml = node_farm(tmp_path, redis_url, engine={
        "kind": "sglang", "model_path": "/models/policy", "deterministic": True,
        "sglang_args": ["--mem-fraction-static", "0.8"]})
    base = load_config(toml).engine.base_port
    env = {**os.environ, "PYTHONPATH": str(fake), "STAND_IN_RECORD": str(record)}
    env.pop(SGLANG_PYTHON_ENV, None)  # the fake sglang is this Python's (node's own)
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
    toml = node_farm(tmp_path, redis_url, engine={"kind": "sglang"})
    proc = subprocess.run([cli_exe(), "node", "--gpus", "0", "-c", str(toml)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "engine.model_path" in proc.stderr


@pytest.mark.parametrize(("engine", "refusal"), [
    ({"kind": "sglang", "model_path": "/m", "python": sys.executable},
     f"engine.python: {sys.executable} (engine.python) cannot import sglang"),
    ({"kind": "sglang", "model_path": "/m", "sglang_args": ["--device", "cpu"]},
     "engine.deterministic: a CPU server"),
], ids=["no-sglang", "deterministic-on-cpu"])
def test_node_refuses_replicas_that_cannot_start_before_starting_anything(
        tmp_path, redis_url, engine, refusal):
    if find_spec("sglang") is not None:
        pytest.skip("this Python has SGLang")
    toml = node_farm(tmp_path, redis_url, engine=engine)
    proc = subprocess.run([cli_exe(), "node", "--gpus", "0", "-c", str(toml)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert refusal in proc.stderr
    assert not (tmp_path / "state" / "node").exists()  # nothing started


def test_a_replica_port_in_use_is_refused_naming_engine_base_port_before_anything_starts(
        tmp_path, redis_url):
    toml = node_farm(tmp_path, redis_url, engine={"kind": "sim"})
    base = load_config(toml).engine.base_port
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 1))  # GPU 1's replica's port
        held.listen()
        with pytest.raises(ConfigError) as refused:
            check_ports(load_config(toml), [0, 1])
        assert str(refused.value).startswith(
            f"engine.base_port + 1 (GPU 1) {base + 1} is in use: [Errno 98] Address already "
            "in use")
        proc = subprocess.run([cli_exe(), "node", "--gpus", "0-1", "-c", str(toml)],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == f"queue-rollout: {refused.value}\n"
    assert proc.stdout == "" and not (tmp_path / "state" / "node" / "boots.jsonl").exists()


@pytest.mark.e2e
def test_node_on_ctrl_c_says_what_it_waits_for_and_a_second_ctrl_c_stops_it_at_once(
        tmp_path, redis_url, r):
    """A terminal's Ctrl-C reaches the whole group: only node acts on it (its replicas
    keep serving the workers' grace); a second one kills every process at once."""
    toml = node_farm(tmp_path, redis_url, engine={"kind": "sim", "step_ms": 1.0},
                     timeouts={"shutdown_grace": 120})
    node = start_node(toml, "0-1", stderr=subprocess.PIPE, start_new_session=True)
    stop = threading.Event()
    try:
        wait_for(lambda: len(registered(r)) == 2, 60, "two workers registered")
        config = load_config(toml)
        client = RolloutClient.from_config(config)
        Collector(client.ledger, config, name="test").start(stop)
        client.submit([{"id": f"q{i}", "prompt": "x", "member_lengths": [100_000, 100_000]}
                       for i in range(2)])
        wait_for(lambda: client.status()["active_episodes"] == 4, 60, "four episodes running")
        tree = process_tree(node.pid)
        os.killpg(node.pid, signal.SIGINT)
        assert node.stderr is not None
        while not (line := node.stderr.readline()).startswith("node: "):  # past its log
            assert line, "node said nothing about stopping"
        assert line == ("node: stopping: waiting up to 120 s for the running episodes of 2 "
                        "workers to finish; Ctrl-C again to stop now\n")
        os.killpg(node.pid, signal.SIGINT)
        stopped_at = time.monotonic()
        out, err = node.communicate(timeout=120)
        assert node.returncode == 0, err
        assert time.monotonic() - stopped_at < 60  # not the 120 s of grace
        assert "node: stopped now: what was running is redone" in err and "node: stopped" in out
        wait_for(lambda: not alive(tree - {node.pid}), 30, "every process of the node to end")
    finally:
        stop.set()
        if node.poll() is None:
            node.kill()
