"""The farm on real vLLM servers (``pytest -m vllm``): ``queue-rollout up`` on two vLLM
replicas of the tiny untied model, in both admission modes, every member its exact
length, every group delivered once, the ledger clean after; an episode process
SIGKILLed mid-generate (its attempts in doubt until ``timeouts.doubt``); a server
SIGKILLed and started again, by the test under ``up`` and by ``node``, which launched it;
weight updates while episodes run."""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path

import pytest
from faultfarm import (
    FSYNC,
    NodeRun,
    UpFarm,
    causes,
    consume,
    doctor,
    farm_toml,
    generating_processes,
    kill_all,
    new_boot,
    registered,
    replica_pid,
    settled,
)
from real_engine.vllm_server import VLLMServer, untied_model

from queue_rollout import RolloutClient
from queue_rollout.engines.base import EngineError
from queue_rollout.engines.concurrency import metric_totals
from queue_rollout.engines.vllm import VLLMClient
from queue_rollout.lab.bench.real_vllm import CPU_VLLM_ARGS, CPU_VLLM_ENV
from queue_rollout.ledger.embedded import EmbeddedRedis
from queue_rollout.ledger.records import decode_attempt
from testkit import alive, free_ports, process_tree, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

G = 4
LENGTHS = (40, 120, 300, 600)  # rotated by group: both replicas get long and short ones


@pytest.mark.parametrize("mode", ["group", "sample"])
def test_exact_lengths_and_whole_groups_once_on_vllm_replicas(
        tmp_path: Path, vllm_replicas: list[VLLMServer], mode: str) -> None:
    lengths = {f"v-{mode}-{i}": [LENGTHS[(i + m) % len(LENGTHS)] for m in range(G)]
               for i in range(8)}
    farm = UpFarm(tmp_path / "farm", f"vllm-{mode}", [s.url for s in vllm_replicas], mode,
                  {"group_size": G, "kind": "vllm", "pause_mode": "abort", "lease": 10},
                  appendfsync=FSYNC)
    with farm.running() as client:
        client.submit([{"id": gid, "prompt": f"vllm test {gid}", "member_lengths": ls}
                       for gid, ls in lengths.items()])
        got = consume(client, lengths, timeout=600)
        assert not got.wrong and not got.lost and got.duplicated == 0, (
            got.wrong, got.lost, farm.log_tail())
        doctor(farm.toml)


def test_an_episode_process_killed_mid_generate_stays_in_doubt_until_the_doubt_timeout(
        tmp_path: Path, vllm_replicas: list[VLLMServer]) -> None:
    """vLLM cannot confirm that one request stopped (it takes an id in flight, its abort
    answers alike for any id, its gauges lag), so the killed process's attempts stay in
    doubt, their slots kept, until ``timeouts.doubt`` (20 s here) declares them lost;
    then they run again. Every group still comes once, each member its exact length."""
    lengths = {f"k-{i}": [LENGTHS[(i + m) % len(LENGTHS)] * 2 for m in range(G)]
               for i in range(6)}
    farm = UpFarm(tmp_path / "farm", "vllm-kill", [s.url for s in vllm_replicas], "sample",
                  {"group_size": G, "kind": "vllm", "pause_mode": "abort", "lease": 3, "doubt": 20},
                  appendfsync=FSYNC)
    with farm.running() as client:
        client.submit([{"id": gid, "prompt": f"vllm kill {gid}", "member_lengths": ls}
                       for gid, ls in lengths.items()])
        assert farm.proc is not None
        port = int(vllm_replicas[0].url.rsplit(":", 1)[1])
        victims = wait_for(lambda: generating_processes(farm.proc.pid, port), 120,  # type: ignore[union-attr]
                           "an episode process in the middle of a generate")
        before = client.ledger.counters()
        os.kill(victims[0], signal.SIGKILL)
        got = consume(client, lengths, timeout=600)
        assert not got.wrong and not got.lost and got.duplicated == 0, (
            got.wrong, got.lost, farm.log_tail())
        counters = {k: v - before.get(k, 0) for k, v in client.ledger.counters().items()}
        assert causes(counters, "doubts").get("lease_expired", 0) >= 1, counters
        assert causes(counters, "retries").get("doubt_timeout", 0) >= 1, counters
        wait_for(lambda: settled(client) is not None, 60, "the farm to settle")
        doctor(farm.toml)


def greedy_ids(url: str) -> list[int]:
    g = VLLMClient(url, timeout=120).generate(
        f"greedy-{time.time_ns()}", input_ids=list(range(5, 305)), timeout=120,
        sampling_params={"max_new_tokens": 16, "ignore_eos": True, "temperature": 0.0})
    return g.output_ids


#: Tokens a replica generates for a wave before the update: with its requests decoding
#: together, a few tokens each, and far less than the longest member's 1,800.
DECODED = 64


def generated(url: str) -> float:
    """Tokens the vLLM server at *url* has generated so far (its counter moves each step).
    A server too busy to answer within 10 s (a loaded machine) is asked again, for up to
    a minute and a half."""
    def ask() -> tuple[float] | None:
        try:
            return (metric_totals(VLLMClient(url).metrics(timeout=10.0)).get(
                "vllm:generation_tokens_total", 0.0),)
        except EngineError:
            return None

    return wait_for(ask, 90, f"{url}/metrics to answer")[0]


def decoding(since: dict[str, float]) -> bool:
    """Each replica has generated *DECODED* tokens more than its count in *since*."""
    return all(generated(url) - count >= DECODED for url, count in since.items())


def test_weight_updates_during_running_episodes(
        tmp_path: Path, vllm_replicas: list[VLLMServer], vllm_python: str) -> None:
    """Three waves of episodes; in the middle of each the trainer loads other weights
    (pausing in ``abort`` mode, the one a vLLM farm takes). After each, every replica's
    greedy output is that of a server started on the weights loaded (the prefix cache
    was reset), every group comes whole with exact lengths, each token carries the
    version before or after the update, and episodes that ran across an update carry
    both."""
    seed0, seed1 = (str(untied_model(vllm_python, s)) for s in (0, 1))
    reference = {seed0: greedy_ids(vllm_replicas[0].url)}
    fresh = VLLMServer(vllm_python, Path(seed1), tmp_path)
    fresh.start()
    try:
        reference[seed1] = greedy_ids(fresh.url)
    finally:
        fresh.stop()
    assert reference[seed0] != reference[seed1]
    waves = [seed1, seed0, seed1]
    versions: dict[int, set[tuple[int, ...]]] = {}
    urls = [s.url for s in vllm_replicas]
    farm = UpFarm(tmp_path / "farm", "vllm-weights", urls,
                  "sample", {"group_size": G, "kind": "vllm", "pause_mode": "abort", "lease": 10,
                             "doubt": 20},
                  appendfsync=FSYNC)
    try:
        with farm.running() as client:
            for version, weights in enumerate(waves, start=1):
                lengths = {f"w{version}-{i}": [LENGTHS[(i + m) % len(LENGTHS)] * 3
                                               for m in range(G)] for i in range(4)}
                before = {url: generated(url) for url in urls}
                client.submit([{"id": gid, "prompt": f"vllm weights {gid}",
                                "member_lengths": ls} for gid, ls in lengths.items()])
                wait_for(lambda: client.status()["active_episodes"] >= 4, 90,
                         "episodes running")
                # Every replica well into decoding this wave (a few steps of each
                # request it runs), far from the end of the longest members.
                wait_for(partial(decoding, before), 120, "the wave decoding on every replica")
                client.update_weights(weights, version)
                got = consume(client, lengths, timeout=400)
                assert not got.wrong and not got.lost and got.duplicated == 0, (
                    version, got.wrong, got.lost, farm.log_tail())
                versions[version] = {tuple(v) for v in got.versions}
                for server in vllm_replicas:
                    assert greedy_ids(server.url) == reference[weights], (version, server.url)
                    info = VLLMClient(server.url).server_info()
                    assert info["boot_id"]
            doctor(farm.toml)
    finally:
        for server in vllm_replicas:
            client_ = VLLMClient(server.url, timeout=120)
            client_.resume()
            client_.update_weights_from_disk(seed0, weight_version="default")
    for version, seen in versions.items():
        assert all(set(v) <= {version - 1, version} for v in seen), (version, seen)
    # an update that lands while episodes run: they carry both versions (on a loaded
    # CPU, vLLM's pause may land after a wave's last token: at least one wave of three)
    assert any((v - 1, v) in seen for v, seen in versions.items()), versions


def test_a_replica_killed_and_restarted_under_up(
        tmp_path: Path, vllm_replicas: list[VLLMServer]) -> None:
    """A vLLM server SIGKILLed with episodes running and started again on its port: its
    worker sees a new instance id (the boot id), starts new episode processes, and the
    attempts that were on it are settled (in doubt, then run again); every group comes
    once with exact lengths."""
    lengths = {f"r-{i}": [LENGTHS[(i + m) % len(LENGTHS)] * 2 for m in range(G)]
               for i in range(6)}
    victim = vllm_replicas[1]
    boot = VLLMClient(victim.url).server_info()["boot_id"]
    farm = UpFarm(tmp_path / "farm", "vllm-restart", [s.url for s in vllm_replicas],
                  "sample", {"group_size": G, "kind": "vllm", "pause_mode": "abort", "lease": 3},
                  appendfsync=FSYNC)
    with farm.running() as client:
        client.submit([{"id": gid, "prompt": f"vllm restart {gid}", "member_lengths": ls}
                       for gid, ls in lengths.items()])
        wait_for(lambda: running_on(client, victim.url) >= 2, 120, "episodes on the victim")
        before = client.ledger.counters()
        victim.kill()
        time.sleep(5)
        victim.start()
        assert VLLMClient(victim.url).server_info()["boot_id"] != boot
        got = consume(client, lengths, timeout=600)
        assert not got.wrong and not got.lost and got.duplicated == 0, (
            got.wrong, got.lost, farm.log_tail())
        counters = {k: v - before.get(k, 0) for k, v in client.ledger.counters().items()}
        assert sum(causes(counters, "retries").values()) >= 1, counters
        assert "replica restarted" in farm.log_tail(400), farm.log_tail(60)
        wait_for(lambda: settled(client) is not None, 60, "the farm to settle")
        doctor(farm.toml)


SERVER = "vllm.entrypoints.openai.api_server"


def test_a_replica_killed_under_node_comes_back_under_a_new_instance_id(
        tmp_path: Path, vllm_python: str) -> None:
    """`node --gpus 0` launches a vLLM replica (its command, its environment, the tier's
    CPU arguments) and a worker pinned to it, which takes the replica's own boot id (its
    instance id) over the one node gave. With episodes on it the replica's whole process
    tree is SIGKILLed: node starts it again, its worker comes back under the new instance
    id and settles the old one's attempts at once (``replica_restart``); every group
    comes once, each member its exact length. SIGTERM then stops node: nothing it started
    left running, its worker deregistered."""
    gpu, port = 0, free_ports(1)
    redis = EmbeddedRedis(tmp_path / "redis", appendfsync="always", write_url=False)
    url = redis.start()
    engine = {"python": vllm_python, "model_path": str(untied_model(vllm_python, 0)),
              "base_port": port, "vllm_args": list(CPU_VLLM_ARGS)}
    toml = farm_toml(tmp_path / "farm.toml", name="vllm-node", redis_url=url, urls=[],
                     mode="sample", group_size=G, kind="vllm", pause_mode="abort", lease=3,
                     engine_extra=engine)  # doubt: 900 s, longer than the restart
    node = NodeRun(toml, gpu, {**os.environ, "OMP_NUM_THREADS": "1", **CPU_VLLM_ENV},
                   tmp_path / "node.log")
    lengths = {f"n-{i}": [LENGTHS[(i + m) % len(LENGTHS)] * 2 for m in range(G)]
               for i in range(4)}
    try:
        with node.running() as proc:
            client = RolloutClient.from_config(toml)
            first = wait_for(lambda: registered(client).get(gpu), 400,
                             "a worker against its replica")
            replica = f"http://127.0.0.1:{port}"
            assert first == VLLMClient(replica).server_info()["boot_id"]
            client.submit([{"id": gid, "prompt": f"vllm node {gid}", "member_lengths": ls}
                           for gid, ls in lengths.items()])
            wait_for(lambda: running_on(client, replica) >= 2, 120,
                     "episodes on the replica")
            before = client.ledger.counters()
            doomed = process_tree(replica_pid(proc.pid, SERVER, port))
            assert len(doomed) >= 2  # the API server and its engine core
            kill_all(doomed)  # all at once
            wait_for(lambda: not alive(doomed), 30, "the replica's processes to die")
            second = wait_for(lambda: new_boot(client, gpu, first), 400,
                              "node to restart the replica and its worker")
            assert second == VLLMClient(replica).server_info()["boot_id"]
            got = consume(client, lengths, timeout=600)
            assert not got.wrong and not got.lost and got.duplicated == 0, (
                got.wrong, got.lost, node.log_tail())
            counters = {k: v - before.get(k, 0)
                        for k, v in client.ledger.counters().items()}
            assert causes(counters, "retries").get("replica_restart", 0) >= 1, counters
            wait_for(lambda: settled(client) is not None, 60, "the farm to settle")
            doctor(toml)
        node.check_stopped(client, SERVER, port)
    finally:
        redis.stop()


def running_on(client: RolloutClient, url: str) -> int:
    """Attempts running on the replica at *url*."""
    ledger = client.ledger
    return sum(1 for raw in ledger.client.hgetall(ledger.keys.attempts).values()
               if (a := decode_attempt(raw)).state == "running" and a.replica == url)
