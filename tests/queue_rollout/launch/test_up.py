"""`queue-rollout up`, then the CLI against it: submit, consume, status, pause."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from queue_rollout.ledger.embedded import free_port
from testkit import farm_up, wait_for
from testkit import write_up_farm as write_farm

pytestmark = pytest.mark.e2e

EXE = shutil.which("queue-rollout", path=str(Path(sys.executable).parent))


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_up_runs_a_farm_the_other_commands_find(tmp_path):
    state = tmp_path / "state"
    metrics_port = free_port()
    toml = write_farm(tmp_path / "farm.toml", "up", state, slots=2, metrics_port=metrics_port,
                      rollout="group_size = 2\nbatch_size = 2\nmax_concurrent_samples = 8")
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
        assert "queue_rollout_groups_consumed_total 4.0" in metrics
    assert not (state / "redis.url").exists()


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
    limit = ("max_concurrent_samples = 8" if mode == "sample"
             else "max_concurrent_rollouts = 2")
    toml = write_farm(tmp_path / f"{mode}.toml", f"ref-{mode}", tmp_path / mode, slots=4,
                      metrics_port=free_port(),
                      rollout=f"group_size = 4\nbatch_size = 1\n{limit}")
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


def test_reference_scenario_sample_refill_delivers_the_short_group_first(tmp_path):
    assert run_reference_scenario(tmp_path, "sample") == "third"
    assert run_reference_scenario(tmp_path, "group") != "third"


def test_zero_variance_math_groups_are_rejected_and_replaced(tmp_path):
    metrics_port = free_port()
    toml = write_farm(
        tmp_path / "farm.toml", "zv", tmp_path / "state", slots=4, metrics_port=metrics_port,
        step_ms_per_request=0.2,
        rollout="group_size = 4\nbatch_size = 2\nmax_concurrent_samples = 8\nmax_staleness = 0",
        extra='[acceptance]\nreject_zero_variance = true\n'
              '[workflow]\nname = "math"\n[workflow.sampling]\nmax_new_tokens = 64\n')
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
    assert f'groups_rejected_total{{reason="zero_variance"}} {float(g["rejected"])}' in metrics
    assert f"queue_rollout_groups_accepted_total {float(g['accepted'])}" in metrics
    assert f"queue_rollout_groups_consumed_total {float(g['consumed'])}" in metrics
    assert f"queue_rollout_sample_slots_reserved {float(status['reserved'])}" in metrics


def test_refill_delivers_while_stragglers_run_and_pause_does_not_wait_for_them(tmp_path):
    from queue_rollout import RolloutClient

    toml = write_farm(
        tmp_path / "farm.toml", "st", tmp_path / "state", slots=4, metrics_port=free_port(),
        rollout="group_size = 4\nbatch_size = 1\nmax_concurrent_samples = 8\nmax_staleness = 10")
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


def test_a_trainer_resuming_at_version_10_gets_no_burst(tmp_path):
    """A fresh farm, `set-version 10` (a trainer resuming from a checkpoint), then
    prompts: at most (max_staleness + 1) * B = 3 groups are admitted ahead of the
    trainer, and no consumed group is more than max_staleness versions old."""
    metrics_port = free_port()
    toml = write_farm(tmp_path / "farm.toml", "resume", tmp_path / "state", slots=4,
                      metrics_port=metrics_port,
                      rollout="group_size = 2\nbatch_size = 1\nmax_staleness = 2\n"
                              "max_concurrent_samples = 8")
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
            and "queue_rollout_consumed_group_staleness_count 12.0" in text and text,
            timeout=30, what="12 staleness observations")
        assert 'queue_rollout_consumed_group_staleness_bucket{le="2.0"} 12.0' in metrics
