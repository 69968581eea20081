"""The Prometheus target files `up` and `node` write: what they list, how they are
written, an `up` farm's file naming the replicas its workers use and its collector's
exporter, and a `node`'s naming its replicas' ports, each emptied on a clean stop."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request

import msgspec
import pytest

from queue_rollout.config import Config
from queue_rollout.launch.targets import (
    NODE_FILE,
    clear_targets,
    host_port,
    replica_group,
    targets_path,
    up_groups,
    write_node_targets,
    write_targets,
    write_up_targets,
)
from queue_rollout.ledger.connection import connect
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import Registry
from queue_rollout.procs import cli_exe
from testkit import farm_up, free_ports, wait_for, write_farm, write_up_farm


def config(tmp_path, **metrics: object) -> Config:
    return msgspec.convert({"farm": {"name": "tf", "state_dir": str(tmp_path / "state")},
                            "metrics": metrics}, Config)


def test_up_lists_each_replica_with_its_gpu_and_the_collector(tmp_path):
    c = config(tmp_path, port=9555)
    assert up_groups(c, ["http://127.0.0.1:41001", "http://127.0.0.1:41002"]) == [
        {"targets": ["127.0.0.1:41001"], "labels": {"farm": "tf", "role": "replica", "gpu": "0"}},
        {"targets": ["127.0.0.1:41002"], "labels": {"farm": "tf", "role": "replica", "gpu": "1"}},
        {"targets": ["127.0.0.1:9555"], "labels": {"farm": "tf", "role": "collector"}}]
    path = write_up_targets(c, ["http://127.0.0.1:41001"])
    assert path == tmp_path / "state" / "prometheus" / "targets.json"
    assert json.loads(path.read_text()) == up_groups(c, ["http://127.0.0.1:41001"])


def test_addresses_become_what_prometheus_scrapes(tmp_path):
    c = config(tmp_path, host="0.0.0.0")
    assert up_groups(c, [])[0]["targets"] == ["127.0.0.1:9464"]  # every address: loopback
    assert host_port("::", 9) == "[::1]:9" and host_port("fe80::1", 9) == "[fe80::1]:9"
    remote = replica_group(c, "https://gpu7.example:8443/sglang/", 7)
    assert remote == {"targets": ["gpu7.example:8443"], "labels": {
        "farm": "tf", "role": "replica", "gpu": "7", "__scheme__": "https",
        "__metrics_path__": "/sglang/metrics"}}
    assert replica_group(c, "https://h", 0)["targets"] == ["h:443"]
    assert replica_group(c, "10.0.0.5:30000", 0)["targets"] == ["10.0.0.5:30000"]


def test_node_lists_its_replicas_in_a_file_of_its_own(tmp_path):
    c = config(tmp_path)
    path = write_node_targets(c, [(2, "http://127.0.0.1:30000"), (5, "http://127.0.0.1:30001")])
    assert path == targets_path(c, NODE_FILE) and path.name == "node-targets.json"
    assert path.parent == targets_path(c).parent  # one folder: one glob finds both files
    groups = json.loads(path.read_text())
    assert [(g["targets"], g["labels"]["gpu"]) for g in groups] == [
        (["127.0.0.1:30000"], "2"), (["127.0.0.1:30001"], "5")]
    assert {g["labels"]["role"] for g in groups} == {"replica"}


def test_the_file_is_replaced_whole_only_when_it_changes_and_emptied_at_the_end(tmp_path):
    path = tmp_path / "p" / "targets.json"
    clear_targets(path)
    assert not path.exists()  # never written: nothing to empty
    groups = [{"targets": ["a:1"], "labels": {"farm": "x"}}]
    assert write_targets(path, groups) is True
    inode = path.stat().st_ino
    assert write_targets(path, groups) is False and path.stat().st_ino == inode
    assert write_targets(path, [*groups, {"targets": ["b:2"], "labels": {}}]) is True
    assert path.stat().st_ino != inode  # a new file renamed over the old one
    assert [p.name for p in path.parent.iterdir()] == ["targets.json"]  # no temporary left
    clear_targets(path)
    assert json.loads(path.read_text()) == []  # Prometheus drops the targets


@pytest.mark.e2e
def test_an_up_farm_lists_the_replicas_its_workers_use_and_its_collector(tmp_path):
    state = tmp_path / "state"
    metrics_port = free_port()
    toml = write_up_farm(tmp_path / "farm.toml", "tgt", state, slots=2,
                         metrics_port=metrics_port, rollout={"group_size": 2, "batch_size": 1})
    path = state / "prometheus" / "targets.json"
    with farm_up(toml) as line:
        assert "farm tgt up" in line
        groups = json.loads(path.read_text())
        assert {json.dumps(g["labels"], sort_keys=True) for g in groups} == {
            json.dumps(x, sort_keys=True) for x in (
                {"farm": "tgt", "role": "collector"},
                {"farm": "tgt", "role": "replica", "gpu": "0"},
                {"farm": "tgt", "role": "replica", "gpu": "1"})}
        replicas = {g["labels"]["gpu"]: g["targets"] for g in groups
                    if g["labels"]["role"] == "replica"}
        # the replicas the farm's workers registered with (ports chosen at start)
        client = connect((state / "redis.url").read_text())
        live = Registry(client, Keys("tgt"), 10).live()
        assert replicas == {str(r["gpu"]): [r["replica"].removeprefix("http://")]
                            for r in live.values()}
        [collector] = [g["targets"] for g in groups if g["labels"]["role"] == "collector"]
        assert collector == [f"127.0.0.1:{metrics_port}"]
        # every target answers /metrics: replicas SGLang's names, the collector the farm's
        for [target] in replicas.values():
            text = urllib.request.urlopen(f"http://{target}/metrics", timeout=5).read()
            assert b"sglang:num_running_reqs" in text
        text = wait_for(lambda: urllib.request.urlopen(
            f"http://{collector[0]}/metrics", timeout=5).read().decode(), what="/metrics")
        assert 'queue_rollout_workers_alive{farm="tgt"} 2.0' in text
    assert json.loads(path.read_text()) == []  # a clean stop: no targets left


@pytest.mark.e2e
def test_a_node_lists_its_replicas_on_their_ports_and_empties_the_file_on_sigterm(
        tmp_path, redis_url):
    base = free_ports(2)
    toml = write_farm(tmp_path / "farm.toml",
                      farm={"name": "nt", "redis_url": redis_url, "state_dir": tmp_path / "state"},
                      timeouts={"shutdown_grace": 2},
                      engine={"kind": "sim", "slots_per_replica": 2, "base_port": base})
    node = subprocess.Popen([cli_exe(), "node", "--gpus", "3,5", "-c", str(toml)],
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    path = tmp_path / "state" / "prometheus" / "node-targets.json"
    try:
        assert "node: 2 GPUs" in node.stdout.readline()
        groups = json.loads(path.read_text())
        assert groups == [
            {"targets": [f"127.0.0.1:{base}"],
             "labels": {"farm": "nt", "role": "replica", "gpu": "3"}},
            {"targets": [f"127.0.0.1:{base + 1}"],
             "labels": {"farm": "nt", "role": "replica", "gpu": "5"}}]

        def scraped(target: str) -> bytes | None:
            try:
                return urllib.request.urlopen(f"http://{target}/metrics", timeout=5).read()
            except OSError:
                return None

        for g in groups:  # the replicas listen where the file says
            assert b"sglang:num_running_reqs" in wait_for(
                lambda g=g: scraped(g["targets"][0]), 60, what=f"{g['targets']} /metrics")
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(90) == 0
    assert json.loads(path.read_text()) == []
