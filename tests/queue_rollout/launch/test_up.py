"""`queue-rollout up`, then the CLI against it: submit, consume, status, pause."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest

from queue_rollout.config import Config
from queue_rollout.errors import ConfigError
from queue_rollout.lab.virtual.clock import ManualClock
from queue_rollout.launch.up import LocalFarm, footprint, replica_cells, shape_line
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.registry import Registry
from queue_rollout.procs import Supervised, stop_all
from testkit import (
    G2_B1,
    G2_B2,
    alive,
    farm_up,
    process_tree,
    ride_through_a_hard_restart,
    wait_for,
    write_up_farm,
)

EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.e2e
def test_up_runs_a_farm_the_other_commands_find(tmp_path):
    state = tmp_path / "state"
    metrics_port = free_port()
    toml = write_up_farm(tmp_path / "farm.toml", "up", state, slots=2, metrics_port=metrics_port,
                         rollout=G2_B2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "x",
                                           "member_lengths": [40, 80]}) + "\n"
                               for i in range(8)))
    with farm_up(toml) as line:
        assert "farm up up: redis redis://127.0.0.1:" in line and "2 workers" in line
        url = (state / "redis.url").read_text()
        assert_a_second_up_is_refused(toml, state, url)
        assert cli("submit", str(prompts), "-c", str(toml)).returncode == 0
        consumed = cli("consume", "--batches", "2", "--json", "-c", str(toml))
        assert consumed.returncode == 0, consumed.stderr
        batches = [json.loads(x) for x in consumed.stdout.splitlines()]
        assert [len(b["groups"]) for b in batches] == [2, 2]
        for b in batches:
            for g in b["groups"]:
                assert [m["output_tokens"] for m in g["members"]] == [40, 80]
        status = json.loads(cli("status", "--json", "-c", str(toml)).stdout)
        assert list(status["workers"]["limits"].values()) == [2, 2]
        assert (status["workers"]["alive"], status["workers"]["slots"]) == (2, 4)
        assert status["version"] == 2
        assert status["groups"]["consumed"] == 4
        paused = cli("pause", "-c", str(toml))
        assert paused.returncode == 0 and "every live worker confirmed" in paused.stdout
        assert cli("resume", "-c", str(toml)).returncode == 0
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                         timeout=5).read().decode()
        assert 'queue_rollout_groups_consumed_total{farm="up"} 4.0' in metrics
    assert not (state / "redis.url").exists()


@pytest.mark.e2e
def test_up_runs_a_farm_of_cells_with_a_redis_each_the_other_commands_find(tmp_path):
    """`up` with two [[cells]] and no URLs: a control Redis and one per cell, each
    under its own folder; three replicas dealt by weight (a: 1, b: 2); the CLI finds
    every server through the state_dir, and stopping `up` stops them all."""
    state = tmp_path / "state"
    toml = write_up_farm(tmp_path / "farm.toml", "up-cells", state, slots=2,
                         metrics_port=free_port(), rollout=G2_B2, engine={"replicas": 3},
                         cells=[{"name": "a"}, {"name": "b", "weight": 2.0}])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "x",
                                           "member_lengths": [40, 80]}) + "\n"
                               for i in range(8)))
    urls = [state / "redis.url", state / "cells" / "a" / "redis.url",
            state / "cells" / "b" / "redis.url"]
    with farm_up(toml) as line:
        assert "3 workers" in line and ", cell a redis://127.0.0.1:" in line, line
        assert len({u.read_text() for u in urls}) == 3
        assert cli("submit", str(prompts), "-c", str(toml)).returncode == 0
        consumed = cli("consume", "--batches", "4", "--json", "-c", str(toml))
        assert consumed.returncode == 0, consumed.stderr
        groups = [g for b in map(json.loads, consumed.stdout.splitlines()) for g in b["groups"]]
        assert sorted(g["id"] for g in groups) == [f"q{i}" for i in range(8)]
        assert all([m["output_tokens"] for m in g["members"]] == [40, 80] for g in groups)
        status = json.loads(cli("status", "--json", "-c", str(toml)).stdout)
        assert {n: c["workers"]["alive"] for n, c in status["cells"].items()} == {"a": 1, "b": 2}
        assert status["groups"]["consumed"] == 8
        assert cli("pause", "-c", str(toml)).returncode == 0
        assert cli("resume", "-c", str(toml)).returncode == 0
        doctor = cli("doctor", "-c", str(toml))
        assert doctor.returncode == 0 and "doctor: cell b: ok" in doctor.stdout, doctor.stdout
    assert not any(u.exists() for u in urls)


def test_up_deals_its_replicas_over_the_cells_by_weight():
    def dealt(replicas: int, *weights: float) -> list[str | None]:
        return replica_cells(msgspec.convert({"cells": [
            {"name": f"c{i}", "weight": w} for i, w in enumerate(weights)]}, Config), replicas)

    assert dealt(3, 1.0, 2.0) == ["c0", "c1", "c1"]
    assert dealt(4, 1.0, 1.0, 1.0) == ["c0", "c0", "c1", "c2"]
    assert dealt(3, 1.0, 100.0, 1.0) == ["c0", "c1", "c2"]  # every cell has a worker
    assert dealt(10, 1.0, 4.0) == ["c0"] * 2 + ["c1"] * 8
    assert replica_cells(Config(), 2) == [None, None]
    with pytest.raises(ConfigError, match="3 cells need a worker each, and `up` has 2"):
        dealt(2, 1.0, 1.0, 1.0)


def test_up_says_how_many_processes_it_starts_and_how_to_start_fewer():
    """The defaults: a simulated replica's 16 slots in one episode process (146
    processes with one per slot); SGLang's replicas are not `up`'s, a Redis of one's
    own is not either."""
    default = msgspec.convert({}, Config)
    assert footprint(default) == (26, pytest.approx(0.861))
    assert shape_line(default) == (
        "8 replicas x 16 slots in 26 processes, about 0.9 GB; smaller: engine.replicas, "
        "engine.slots_per_replica in a config (-c farm.toml)")
    per_slot = msgspec.convert({"engine": {"threads_per_process": 1}}, Config)
    assert shape_line(per_slot).startswith("8 replicas x 16 slots in 146 processes, about "
                                           "5.4 GB; ")
    assert "more engine.threads_per_process (slots in one process)" in shape_line(per_slot)
    sglang = msgspec.convert({"farm": {"redis_url": "redis://r:6379/0"},
                              "engine": {"kind": "sglang", "urls": ["http://a:1", "http://b:1"],
                                         "slots_per_replica": 4}}, Config)
    assert footprint(sglang)[0] == 1 + 2 * (1 + 4)  # the collector, the workers, a process a slot
    assert "engine.replicas" not in shape_line(sglang)


def redis_servers_on(data_dir: Path) -> list[int]:
    """The pids of the redis-server processes whose data directory is *data_dir* (it
    works there: redis-server changes to its ``dir``, and rewrites its command line)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (Path(f"/proc/{pid}/comm").read_text().strip() == "redis-server"
                    and os.readlink(f"/proc/{pid}/cwd") == str(data_dir.resolve())):
                pids.append(int(pid))
        except OSError:
            continue
    return pids


def assert_a_second_up_is_refused(toml: Path, state: Path, url: str) -> None:
    """A second `up` on a running farm's config exits 2 at once naming the first; the
    first keeps its files, its one redis-server and its answers."""
    holder = json.loads((state / "farm.lock").read_text())["pid"]
    second = cli("up", "-c", str(toml), timeout=30)
    assert second.returncode == 2, second.stderr
    assert f"farm up is already up: pid {holder} since " in second.stderr
    assert second.stdout == ""
    assert (state / "redis.url").read_text() == url
    assert len(redis_servers_on(state / "redis")) == 1
    status = cli("status", "--json", "-c", str(toml))
    assert status.returncode == 0 and json.loads(status.stdout)["workers"]["alive"] == 2


def run_reference_scenario(tmp_path: Path, mode: str) -> str:
    """DESIGN's reference scenario through the CLI: G=4, 8 slots over 2 simulated
    replicas, B=1; two groups of 2 short + 2 long members, then one of short members.
    Returns the id of the first group delivered."""
    limit = ({"max_concurrent_samples": 8} if mode == "sample"
             else {"max_concurrent_rollouts": 2})
    toml = write_up_farm(tmp_path / f"{mode}.toml", f"ref-{mode}", tmp_path / mode, slots=4,
                         metrics_port=free_port(),
                         rollout={"group_size": 4, "batch_size": 1, **limit})
    prompts = tmp_path / f"{mode}.jsonl"
    short, long = 40, 4000  # 20 ms and 2 s of decoding
    rows = [{"id": "first", "member_lengths": [short, short, long, long]},
            {"id": "second", "member_lengths": [short, long, short, long]},
            {"id": "third", "member_lengths": [short] * 4}]
    prompts.write_text("".join(json.dumps({**row, "prompt": "x"}) + "\n" for row in rows))
    with farm_up(toml) as line:
        assert "farm ref-" in line
        assert cli("submit", str(prompts), "-c", str(toml)).returncode == 0
        consumed = cli("consume", "--batches", "3", "--json", "-c", str(toml))
        assert consumed.returncode == 0, consumed.stderr
        order = [json.loads(x)["groups"][0]["id"] for x in consumed.stdout.splitlines()]
        assert sorted(order) == ["first", "second", "third"]  # each delivered once, whole
        return order[0]


@pytest.mark.e2e
def test_reference_scenario_sample_refill_delivers_the_short_group_first(tmp_path):
    assert run_reference_scenario(tmp_path, "sample") == "third"
    assert run_reference_scenario(tmp_path, "group") != "third"


@pytest.mark.e2e
def test_zero_variance_math_groups_are_rejected_and_replaced(tmp_path):
    metrics_port = free_port()
    toml = write_up_farm(
        tmp_path / "farm.toml", "zv", tmp_path / "state", slots=4, metrics_port=metrics_port,
        rollout={"group_size": 4, "batch_size": 2, "max_concurrent_samples": 8,
                 "max_staleness": 0},
        engine={"step_ms_per_request": 0.2}, acceptance={"reject_zero_variance": True},
        workflow={"name": "math", "sampling": {"max_new_tokens": 64}})
    # always right: zero variance; always wrong: zero variance; 0.5: mixed rewards
    rows = ([{"id": f"easy{i}", "p_correct": 1.0} for i in range(3)]
            + [{"id": f"hard{i}", "p_correct": 0.0} for i in range(3)]
            + [{"id": f"mix{i}", "p_correct": 0.5} for i in range(6)])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({**row, "prompt": "2+2?", "answer": "4"}) + "\n"
                               for row in rows))
    with farm_up(toml) as line:
        assert "farm zv up" in line
        assert cli("submit", str(prompts), "-c", str(toml)).returncode == 0
        # a budget of (0 + 0 + 1) * 2 = 2 groups: the rejected ones must give it back,
        # or no batch of mixed groups could ever be admitted
        consumed = cli("consume", "--batches", "1", "--json", "-c", str(toml))
        assert consumed.returncode == 0, consumed.stderr
        batch = json.loads(consumed.stdout)
        for g in batch["groups"]:
            rewards = [m["reward"] for m in g["members"]]
            assert len(set(rewards)) == 2 and g["id"].startswith("mix")
        # the farm keeps working: compare status and /metrics at a moment when two
        # status reads around the scrape agree
        for _ in range(50):
            before = json.loads(cli("status", "--json", "-c", str(toml)).stdout)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                             timeout=5).read().decode()
            status = json.loads(cli("status", "--json", "-c", str(toml)).stdout)
            if status == before:
                break
    g = status["groups"]
    assert g["rejected"] >= 1  # easy/hard groups came first (FIFO) and were rejected
    assert (f'groups_rejected_total{{farm="zv",reason="zero_variance"}} {float(g["rejected"])}'
            in metrics)
    assert f'queue_rollout_groups_accepted_total{{farm="zv"}} {float(g["accepted"])}' in metrics
    assert f'queue_rollout_groups_consumed_total{{farm="zv"}} {float(g["consumed"])}' in metrics
    reserved = float(status["reserved"])
    assert f'queue_rollout_sample_slots_reserved{{farm="zv"}} {reserved}' in metrics


@pytest.mark.e2e
def test_refill_delivers_while_stragglers_run_and_pause_does_not_wait_for_them(tmp_path):
    from queue_rollout import RolloutClient

    toml = write_up_farm(
        tmp_path / "farm.toml", "st", tmp_path / "state", slots=4, metrics_port=free_port(),
        rollout={"group_size": 4, "batch_size": 1, "max_concurrent_samples": 8,
                 "max_staleness": 10})
    with farm_up(toml) as line:
        assert "farm st up" in line
        client = RolloutClient.from_config(toml)
        straggle = [40, 40, 40, 16000]  # one member decodes for 8 s
        client.submit([{"id": "slow1", "prompt": "x", "member_lengths": straggle},
                       {"id": "slow2", "prompt": "x", "member_lengths": straggle}]
                      + [{"id": f"fast{i}", "prompt": "x", "member_lengths": [40] * 4}
                         for i in range(4)])
        first = client.get_batch(timeout=60)
        assert first.groups[0].id.startswith("fast")  # delivered while the stragglers run
        client.ack(first)
        client.pause()  # returns once replicas paused: the stragglers are not awaited
        assert client.ledger.group("slow1").state == "in_flight"
        assert client.ledger.group("slow2").state == "in_flight"
        client.resume()
        seen = [first.groups[0].id]
        while len(seen) < 6:
            batch = client.get_batch(timeout=120)
            seen.append(batch.groups[0].id)
            client.ack(batch)
        assert sorted(seen) == sorted(["slow1", "slow2"] + [f"fast{i}" for i in range(4)])
        assert set(seen[-2:]) == {"slow1", "slow2"}  # the stragglers' groups came last


@pytest.mark.e2e
def test_a_trainer_resuming_at_version_10_gets_no_burst(tmp_path):
    """A fresh farm, `set-version 10` (a trainer resuming from a checkpoint), then
    prompts: at most (max_staleness + 1) * B = 3 groups are admitted ahead of the
    trainer, and no consumed group is more than max_staleness versions old."""
    metrics_port = free_port()
    toml = write_up_farm(tmp_path / "farm.toml", "resume", tmp_path / "state", slots=4,
                         metrics_port=metrics_port,
                         rollout={**G2_B1, "max_staleness": 2})
    prompts = tmp_path / "prompts.jsonl"
    # each group longer than the one before (by 100 ms of decoding): they complete in
    # the order they were admitted, which is when the budget bounds each one's staleness
    prompts.write_text("".join(json.dumps({"id": f"r{i}", "prompt": "x",
                                           "member_lengths": [20 + 200 * i, 30 + 200 * i]})
                               + "\n" for i in range(12)))
    with farm_up(toml):
        assert cli("set-version", "10", "-c", str(toml)).returncode == 0
        assert cli("submit", str(prompts), "-c", str(toml)).returncode == 0

        def status() -> dict:
            return json.loads(cli("status", "--json", "-c", str(toml)).stdout)

        # once three groups are ready the collector has had every chance to admit more
        s = wait_for(lambda: (x := status())["groups"]["ready"] >= 3 and x, timeout=60,
                     what="three groups ready")
        assert (s["groups"]["pending"], s["groups"]["ready"], s["groups"]["in_flight"]) == (
            9, 3, 0), s
        assert s["budget_baseline"] == -10 and s["version"] == 10

        consumed = cli("consume", "--batches", "12", "--json", "-c", str(toml))
        assert consumed.returncode == 0, consumed.stderr
        batches = [json.loads(x) for x in consumed.stdout.splitlines()]
        assert [b["version"] for b in batches] == list(range(10, 22))
        for b in batches:
            [group] = b["groups"]
            admitted_at = min(v for m in group["members"] for v in m["versions"])
            assert 0 <= b["version"] - admitted_at <= 2, b
        metrics = wait_for(lambda: (text := urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode())
            and 'queue_rollout_consumed_group_staleness_count{farm="resume"} 12.0' in text and text,
            timeout=30, what="12 staleness observations")
        assert ('queue_rollout_consumed_group_staleness_bucket{farm="resume",le="2.0"} 12.0'
                in metrics)


# -- readiness, a port in use, Ctrl-C ----------------------------------------------------

def test_up_is_ready_only_with_every_worker_registered_under_its_current_process(
        redis_url, r, tmp_path):
    """A worker that has not registered, or was restarted (its old record still live),
    is not ready, and what `up` waits for names it with the last thing it said; the
    collector is ready once it leads. The clock is passed in: each reading 1 s on."""
    config = msgspec.convert({"farm": {"name": "rd", "redis_url": redis_url}}, Config)
    ticks = itertools.count()
    farm = LocalFarm(config, tmp_path / "up.toml", clock=lambda: float(next(ticks)))
    said_last = ("2026-01-01 00:00:00,000 INFO queue_rollout.workers.supervisor: worker h-gpu0:"
                 " waiting for its replica http://127.0.0.1:9: connection refused (5 s of 120 s)")
    (tmp_path / "worker-0.log").write_text(said_last + "\n")
    clock = ManualClock(start=0.0)
    worker = Supervised("worker gpu0", [sys.executable, "-c", "import time; time.sleep(120)"],
                        log_path=tmp_path / "worker-0.log", clock=clock)
    collector = Supervised("collector", [sys.executable, "-c", "import time; time.sleep(120)"])
    farm.workers, farm.collector = [worker], collector
    stop = threading.Event()
    registry = Registry(r, Keys("rd"), config.timeouts.lease)
    try:
        farm.keep()
        assert worker.proc is not None and collector.proc is not None
        said: list[str] = []
        assert not farm.wait_ready(stop, 30, say=said.append, say_every=10, poll_s=0)
        assert farm.unready == [f"worker gpu0 (not registered yet; it said: {said_last})",
                                "collector (not leading yet)"]
        assert [line.split(" for: ")[0] for line in said] == ["waiting 10 s", "waiting 20 s"]

        registry.register("h-gpu0", {"pid": worker.proc.pid})
        r.hset(Keys("rd").leader, "holder", "elsewhere-1")
        assert not farm.wait_ready(stop, 5, poll_s=0)
        assert farm.unready == ["collector (not leading yet)"]
        r.hset(Keys("rd").leader, "holder", f"{socket.gethostname()}-{collector.proc.pid}")
        assert farm.wait_ready(stop, 5, poll_s=0) and farm.unready == []

        worker.proc.kill()  # it dies and is restarted; its old record is still live
        worker.proc.wait()
        worker.keep()
        clock.advance(worker.next_start - clock.now)
        worker.keep()
        assert worker.proc is not None and worker.proc.poll() is None
        assert not farm.wait_ready(stop, 5, poll_s=0)
        assert farm.unready == [f"worker gpu0 (not registered yet; exited 1 time, last with "
                                f"-9; it said: {said_last})"]
        stop.set()  # a stop ends the wait without a timeout's warning
        assert not farm.wait_ready(stop, 5, poll_s=0)
    finally:
        stop_all([c.proc for c in (worker, collector) if c.proc], 10)


def up_in_its_own_session(toml: Path, *args: str) -> subprocess.Popen:
    """`up` as a terminal runs it: a Ctrl-C there goes to the whole process group."""
    return subprocess.Popen([EXE, "up", "-c", str(toml), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def running_farm(tmp_path: Path, name: str, grace: int, *args: str
                 ) -> tuple[subprocess.Popen, Path]:
    """`up` with four episodes running (of 100 s each), and its state folder."""
    from queue_rollout import RolloutClient

    state = tmp_path / "state"
    toml = write_up_farm(tmp_path / "farm.toml", name, state, slots=2, metrics_port=free_port(),
                         rollout=G2_B1, timeouts={"shutdown_grace": grace})
    up = up_in_its_own_session(toml, *args)
    assert up.stdout is not None and f"farm {name} up: " in up.stdout.readline()
    client = RolloutClient.from_config(toml)
    client.submit([{"id": f"q{i}", "prompt": "x", "member_lengths": [200_000, 200_000]}
                   for i in range(2)])
    wait_for(lambda: client.status()["active_episodes"] == 4, 60, "four episodes running")
    return up, state


@pytest.mark.e2e
def test_ctrl_c_says_what_it_waits_for_and_stops_within_the_grace(tmp_path):
    """A Ctrl-C reaches the whole group; only `up` acts on it: it says what it waits
    for, the episodes get their 5 s, and it stops. With -v the children's logs are on
    the terminal too; they are in <state_dir>/logs either way."""
    up, state = running_farm(tmp_path, "cc", 5, "-v")
    stopped_at = time.monotonic()
    os.killpg(up.pid, signal.SIGINT)
    out, err = up.communicate(timeout=120)
    took = time.monotonic() - stopped_at
    assert up.returncode == 0, err
    assert took < 5 + 20, took  # the grace and the processes' exits, not 15 s more
    assert ("farm cc: stopping: waiting up to 5 s for 4 running episodes to finish; "
            "Ctrl-C again to stop now") in err
    assert "farm cc stopped" in out and "Traceback" not in err
    assert "worker-0: " in err and "shutdown grace over" in err  # -v: the workers' logs
    logs = state / "logs"
    assert "worker gpu0 started" in (logs / "up.log").read_text()
    assert "shutdown grace over: aborting" in (logs / "worker-1.log").read_text()


@pytest.mark.e2e
def test_a_second_ctrl_c_stops_every_process_at_once(tmp_path):
    up, _ = running_farm(tmp_path, "cc2", 120)
    tree = process_tree(up.pid)
    # what `up` said it starts: redis, 2 replicas, 2 workers with an episode process
    # each, the collector (and `up` itself)
    assert up.stderr is not None
    assert up.stderr.readline().startswith("farm cc2: 2 replicas x 2 slots in 8 processes, ")
    assert len(tree) == 8 + 1
    os.killpg(up.pid, signal.SIGINT)
    assert "Ctrl-C again to stop now" in up.stderr.readline()
    os.killpg(up.pid, signal.SIGINT)
    stopped_at = time.monotonic()
    out, err = up.communicate(timeout=120)
    assert up.returncode == 0, err
    assert time.monotonic() - stopped_at < 60  # not the 120 s of grace
    assert "farm cc2 stopped" in out
    assert "farm cc2: stopped now: what was running is redone" in err
    wait_for(lambda: not alive(tree - {up.pid}), 30, "every process of the farm to end")


@pytest.mark.e2e
def test_up_with_its_metrics_port_in_use_stops_saying_so_with_exit_2(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        toml = write_up_farm(tmp_path / "farm.toml", "busy", tmp_path / "state", slots=2,
                             metrics_port=port, rollout={"group_size": 2, "batch_size": 1})
        done = cli("up", "-c", str(toml), timeout=180)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # never said to be up
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("queue-rollout: collector exited with 2 (bad input or config), "
                           f"not restarted: metrics.port {port} is in use: ")
    # first what it starts, then the reason, then what stopping waits for
    said = done.stderr.splitlines()
    assert said[0] == ("farm busy: 2 replicas x 2 slots in 8 processes, about 0.3 GB; "
                       "smaller: engine.replicas, engine.slots_per_replica in a config "
                       "(-c farm.toml)")
    reason = next(i for i, line in enumerate(said)
                  if line.startswith("farm busy: stopping: collector exited with 2"))
    assert all(i > reason for i, line in enumerate(said) if "no episode is running" in line)
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_up_does_not_claim_a_farm_whose_worker_cannot_reach_its_replica(tmp_path):
    """Nothing listens at the replica's URL: `up` never says the farm is up; it says
    what it waits for (the worker's own words: the URL and the last answer), and a
    Ctrl-C meanwhile stops it without a timeout's message."""
    url = f"http://127.0.0.1:{free_port()}"
    toml = write_up_farm(tmp_path / "farm.toml", "dead", tmp_path / "state", slots=2,
                         metrics_port=free_port(), rollout={"group_size": 2, "batch_size": 1},
                         engine={"kind": "sglang", "urls": [url]})
    up = up_in_its_own_session(toml)
    assert up.stderr is not None
    shape = up.stderr.readline()  # at once
    assert shape.startswith("farm dead: 1 replica x 2 slots in 5 processes, "), shape
    line = up.stderr.readline()  # after 10 s
    assert line.startswith("farm dead: waiting 10 s for: worker gpu0 (not registered yet"), line
    assert f"waiting for its replica {url}: connection refused" in line
    os.killpg(up.pid, signal.SIGINT)
    out, err = up.communicate(timeout=120)
    assert up.returncode == 0, err
    assert " up: " not in out and "farm dead stopped" in out
    assert "farm dead: stopped before it was ready, waiting for: worker gpu0" in err
    assert "not ready within" not in err + line and "Traceback" not in err


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["group", "sample"])
def test_up_killed_hard_with_episodes_running_comes_back_and_a_trainer_rides_through(
        tmp_path, mode):
    """`up` (two simulated replicas of 8 slots) with 16 episodes of 3,000 tokens running
    is SIGKILLed and started again on the same state_dir, with a doubt timeout of an
    hour: its Redis comes back on its port, so the trainer's client, waiting in
    get_batch since before the kill, gets every group; the replicas come back on new
    ports under new boot ids, and each worker settles what its GPU's old replica ran as
    that replica's restart, at once, not after the hour."""
    state = tmp_path / "state"
    limit = ({"max_concurrent_samples": 16} if mode == "sample"
             else {"max_concurrent_rollouts": 4})
    toml = write_up_farm(tmp_path / "farm.toml", f"hard-{mode}", state, slots=8,
                         metrics_port=free_port(),
                         rollout={"group_size": 4, "batch_size": 1, "max_staleness": 100,
                                  **limit},
                         engine={"step_ms": 2.0},  # 6 s an episode
                         timeouts={"doubt": 3600, "lease": 3})
    ups: list[subprocess.Popen] = []

    def start() -> None:
        up = up_in_its_own_session(toml)
        ups.append(up)
        assert up.stdout is not None and f"farm hard-{mode} up: " in up.stdout.readline()

    def kill() -> set[int]:
        tree = process_tree(ups[-1].pid)
        assert len(tree) > 6, tree  # redis, replicas, workers, episode processes, collector
        os.kill(ups[-1].pid, signal.SIGKILL)
        ups[-1].wait()
        return tree

    start()
    first_url = (state / "redis.url").read_text()
    try:
        ride_through_a_hard_restart(toml, kill, start)
        assert (state / "redis.url").read_text() == first_url  # the same port
    finally:
        for up in ups:
            if up.poll() is None:
                up.send_signal(signal.SIGINT)
                up.communicate(timeout=120)
    assert ups[-1].returncode == 0
