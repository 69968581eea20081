"""Security by default (issue [7/7]): every listening socket of a whole farm is on
loopback unless configured otherwise; nothing executable travels on the wire."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
from pathlib import Path

import msgspec
import pytest

import queue_rollout
from queue_rollout.ledger.embedded import free_port
from queue_rollout.procs import cli_exe
from testkit import process_tree, wait_for, write_up_farm

PACKAGE = Path(queue_rollout.__file__).parent


def _listening(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the processes *pids* listen on."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = []
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            raw = bytes.fromhex(addr)
            # /proc prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))
            text = ".".join(map(str, words)) if size == 4 else words.hex(":", 2)
            found.append((text, int(port, 16)))
    return found


@pytest.mark.e2e
def test_every_endpoint_of_a_farm_listens_on_loopback_by_default(tmp_path):
    """`up` runs Redis, the collector's /metrics and /healthz, and sim replicas; every
    socket they listen on is 127.0.0.1 (a listener on 0.0.0.0 or :: fails this)."""
    metrics_port = free_port()
    toml = write_up_farm(tmp_path / "farm.toml", "sec", tmp_path / "state",
                         rollout={"group_size": 2, "batch_size": 1, "max_concurrent_samples": 4},
                         slots=2, metrics_port=metrics_port)
    up = subprocess.Popen([cli_exe(), "up", "-c", str(toml)], stdout=subprocess.PIPE,
                          text=True)
    try:
        assert " up: redis " in up.stdout.readline()
        listeners = wait_for(lambda: (found := _listening(process_tree(up.pid))) and len(found) >= 4
                             and found, what="Redis, metrics and 2 replicas listening")
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0
    assert ("127.0.0.1", metrics_port) in listeners
    assert {addr for addr, _ in listeners} == {"127.0.0.1"}, listeners


def test_the_sim_engine_and_sglang_replicas_bind_loopback_unless_told(tmp_path):
    from queue_rollout.config import Config
    from queue_rollout.launch.node import replica_argv

    port = free_port()
    proc = subprocess.Popen([cli_exe(), "sim-engine", "--port", str(port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert f"listening on http://127.0.0.1:{port}" in proc.stdout.readline()
        assert _listening(process_tree(proc.pid)) == [("127.0.0.1", port)]
    finally:
        proc.terminate()
        proc.wait(30)
    config = msgspec.convert({"engine": {"kind": "sglang", "model_path": "/m"}}, Config)
    argv = replica_argv(config, 0, 30000, "boot", tmp_path / "requests.jsonl")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_no_module_can_unpickle_or_evaluate():
    """pickle, marshal, shelve, dill and eval/exec appear nowhere in the package: RQ
    payloads are JSON (tests/queue_rollout/test_dispatch.py), results msgspec."""
    banned_modules = {"pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                names = [node.func.id] if node.func.id in ("eval", "exec") else []
            else:
                continue
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno} {n}" for n in names
                      if n in banned_modules | {"eval", "exec"}]
    assert found == []
