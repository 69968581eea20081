"""A network partition, on one machine: Redis in one network namespace, two worker
hosts (each a worker and its replica) in two others, the collector and the trainer in
the root namespace, all on one bridge. One worker host is cut off mid-run: its running
attempts turn doubtful and keep their slots, and no second attempt of those episodes
starts (the other host's worker must not settle them, although its replica has the same
loopback URL). The link comes back: the late completions count once, every group is
delivered once, and the replicas' own logs show one request per episode.

Needs root and network namespaces (``ip netns``); skips with the reason otherwise."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from queue_rollout import RolloutClient
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import find_redis_server, free_port
from queue_rollout.ledger.records import decode_attempt
from queue_rollout.procs import cli_exe, stop_all
from testkit import G2_B2, wait_for, write_farm

pytestmark = pytest.mark.e2e

SUBNET = f"10.77.{os.getpid() % 200 + 20}"  # 10.77.N.0/24, N per test process
TAG = f"q{os.getpid() % 10000}"  # interface names stay under 15 characters
HOSTS = {"redis": 2, "a": 3, "b": 4}


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextmanager
def network() -> Iterator[dict[str, str]]:
    """A bridge with one namespace per host; yields host -> namespace name."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot build network namespaces")
    bridge = f"{TAG}br"
    spaces = {host: f"{TAG}{host}" for host in HOSTS}
    try:
        try:
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"{SUBNET}.1/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
            for host, ns in spaces.items():
                _ip("netns", "add", ns)
                _ip("link", "add", f"{ns}h", "type", "veth", "peer", "name", f"{ns}n")
                _ip("link", "set", f"{ns}n", "netns", ns)
                _ip("link", "set", f"{ns}h", "master", bridge)
                _ip("link", "set", f"{ns}h", "up")
                _ip("addr", "add", f"{SUBNET}.{HOSTS[host]}/24", "dev", f"{ns}n", ns=ns)
                _ip("link", "set", f"{ns}n", "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot build network namespaces here (`{' '.join(exc.cmd)}`: "
                        f"{exc.stderr.strip()}): the partition test needs root and netns")
        yield spaces
    finally:
        for ns in spaces.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def in_ns(ns: str, argv: list[str], log: Path, **kw) -> subprocess.Popen:
    with log.open("ab") as f:
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], stderr=f, **kw)


def test_a_cut_off_worker_host_keeps_its_slots_and_its_late_results_count_once(tmp_path):
    with network() as ns:
        procs: list[subprocess.Popen] = []
        try:
            redis_port = 6390
            procs.append(in_ns(ns["redis"], [
                find_redis_server(), "--port", str(redis_port), "--bind", f"{SUBNET}.2",
                "--protected-mode", "no", "--appendonly", "yes", "--save", "",
                "--dir", str(tmp_path)], tmp_path / "redis.log", stdout=subprocess.DEVNULL))
            url = f"redis://{SUBNET}.2:{redis_port}/0"
            toml = write_farm(tmp_path / "farm.toml", farm={"name": "part", "redis_url": url},
                              rollout={**G2_B2, "max_staleness": 100},
                              engine={"slots_per_replica": 4},
                              timeouts={"lease": 3, "doubt": 600, "shutdown_grace": 2},
                              metrics={"port": free_port()})
            for gpu, host in enumerate(("a", "b")):
                engine = in_ns(ns[host], [cli_exe(), "sim-engine", "--port", "30000", "--slots",
                                          "4", "--step-ms", "1", "--step-ms-per-request", "0",
                                          "--request-log",
                                          str(tmp_path / f"requests-{host}.jsonl")],
                               tmp_path / f"engine-{host}.log", stdout=subprocess.PIPE, text=True)
                procs.append(engine)
                assert re.search(r"http://127.0.0.1:30000", engine.stdout.readline())
                procs.append(in_ns(ns[host], [cli_exe(), "worker", "--gpu", str(gpu),
                                              "--engine-url", "http://127.0.0.1:30000",
                                              "-c", str(toml)],
                                   tmp_path / f"worker-{host}.log", stdout=subprocess.DEVNULL))
            with (tmp_path / "collector.log").open("ab") as f:
                procs.append(subprocess.Popen([cli_exe(), "collector", "-c", str(toml)],
                                              stderr=f, stdout=subprocess.DEVNULL))
            client = RolloutClient.from_config(toml)
            ledger = client.ledger
            wait_for(lambda: client.status()["workers"]["alive"] == 2, 60, "two workers")
            groups = [f"g{i:02d}" for i in range(16)]
            client.submit([{"id": g, "prompt": "x", "member_lengths": [2000, 3000]}
                           for g in groups])
            delivered: list[str] = []

            def trainer() -> None:
                while len(delivered) < len(groups):
                    batch = client.get_batch(timeout=180)
                    client.ack(batch)
                    delivered.extend(g.id for g in batch.groups)

            thread = threading.Thread(target=trainer, daemon=True)
            thread.start()

            def running_on_a() -> dict[str, tuple[str, int]]:
                out = {}
                for aid, raw in ledger.client.hgetall(ledger.keys.attempts).items():
                    a = decode_attempt(raw)
                    if a.state == "running" and a.worker.endswith("-gpu0"):
                        out[aid.decode()] = (a.group_id, a.member)
                return out

            cut = wait_for(lambda: (r := running_on_a()) and len(r) >= 3 and r, 60,
                           "attempts running on host a", every=0.05)
            _ip("link", "set", f"{ns['a']}h", "down")  # host a is cut off
            try:
                wait_for(lambda: all((a := ledger.attempt(aid)) is not None
                                     and a.state == "doubtful" for aid in cut), 30,
                         "host a's attempts doubtful")
                # longer than a lease plus a resolver round of the other host's worker
                # (both 3 s), so it would have settled them by now if it took them for
                # its own; host a's replica finishes them meanwhile, unseen
                time.sleep(8)
                counters = ledger.counters()
                assert counters["doubtful"] >= len(cut)
                assert counters["reserved"] >= len(cut)  # their slots stay taken
                for aid, (gid, member) in cut.items():
                    attempts = ledger.member_attempts(gid, member)
                    assert [a for a, _ in attempts] == [aid], f"{gid}/{member} started again"
            finally:
                _ip("link", "set", f"{ns['a']}h", "up")  # the link comes back
            thread.join(180)
            assert not thread.is_alive(), "not every group was delivered after the cut"
            assert sorted(delivered) == groups  # every group, once
            counters = ledger.counters()
            retries = {k: v for k, v in counters.items() if k.startswith(("retries:", "doubts:"))}
            assert not any(k.startswith("retries:") for k in retries), retries
            assert counters["finished"] == 32 and counters.get("reserved", 0) == 0
            assert examine(ledger.client, ledger.keys, ledger.rollout.batch_size).ok
        finally:
            stop_all(procs, 30)
        rids = [json.loads(line)["rid"] for host in ("a", "b")
                for line in (tmp_path / f"requests-{host}.jsonl").read_text().splitlines()]
        assert len(rids) == 32 and len(set(rids)) == 32  # one request per episode
        assert set(cut) <= set(rids)  # the cut-off host ran its attempts to the end
