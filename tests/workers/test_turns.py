"""Multi-turn episodes with tools (`controlled_turns`): through `up`, `submit` and
`consume`, and a worker killed in a tool wait."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from contextlib import ExitStack
from typing import Any

import pytest
from rq.serializers import JSONSerializer
from rq.worker import Worker

from queue_rollout.collector.reconciler import Reconciler
from queue_rollout.engines.base import episode_seed, turn_rid
from queue_rollout.engines.synthetic import token_ids
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.embedded import free_port
from queue_rollout.ledger.jobs import flush_outbox
from queue_rollout.ledger.keys import EVENTS_GROUP
from queue_rollout.ledger.status import farm_status
from queue_rollout.procs import cli_exe
from queue_rollout.results import decode_result
from testkit import WorkerFarm, farm_up, wait_for, write_up_farm, write_worker_farm

pytestmark = pytest.mark.e2e

PROMPT = list(range(1000, 1064))  # 64 tokens, one prompt for every member of a group


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cli_exe(), *args], capture_output=True, text=True, timeout=180)


def member_turns(i: int, m: int) -> list[dict[str, Any]]:
    return [{"gen": 10 + (i * 7 + m * 13 + t * 5) % 40, "tool_s": 0.02 * (1 + (i + t) % 3),
             "tool_tokens": 4 + t} for t in range(3)]


def test_32_groups_of_4_three_turn_episodes_each_delivered_once_with_their_turns(tmp_path):
    rows = []
    for i in range(32):
        members: list[Any] = [member_turns(i, m) for m in range(4)]
        if i == 0:  # a harness failure: consumed with reward 0, not rejected
            members[3] = {"turns": members[3], "harness_error": True}
        rows.append({"id": f"t{i:02d}", "input_ids": PROMPT, "member_turns": members})
    prompts = tmp_path / "turns.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    logs = tmp_path / "requests"
    port = free_port()
    toml = write_up_farm(
        tmp_path / "farm.toml", "turns", tmp_path / "state", slots=8, metrics_port=port,
        rollout={"group_size": 4, "batch_size": 4, "max_concurrent_samples": 16,
                 "max_staleness": 1000},
        workflow={"name": "controlled_turns"})
    with farm_up(toml, "--request-log-dir", str(logs)) as line:
        assert "farm turns up" in line
        assert cli("submit", str(prompts), "-c", str(toml)).returncode == 0
        consumed = cli("consume", "--batches", "8", "--json", "-c", str(toml))
        assert consumed.returncode == 0, consumed.stderr
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                         timeout=5).read().decode()
        status = json.loads(cli("status", "--json", "-c", str(toml)).stdout)
        assert cli("doctor", "-c", str(toml)).returncode == 0
    delivered = [g for line in consumed.stdout.splitlines() for g in json.loads(line)["groups"]]
    assert sorted(g["id"] for g in delivered) == [row["id"] for row in rows]  # each once
    for g in delivered:
        i = int(g["id"][1:])
        for member in g["members"]:
            want = [t["gen"] for t in member_turns(i, member["member"])]
            assert member["turn_lengths"] == want
            assert member["output_tokens"] == sum(want)
            harness = (i, member["member"]) == (0, 3)
            assert member["reward"] == (0.0 if harness else None)
            assert member["finish_reason"] == ("harness_error" if harness else "length")
    assert status["tool_waits"] == 0 and status["active_episodes"] == 0
    assert 'queue_rollout_turns_total{farm="turns"} 384.0' in metrics
    assert 'queue_rollout_tool_wait_seconds_count{farm="turns"} 384.0' in metrics
    # the replicas' own logs: one request per turn, each carrying the whole context so
    # far, the previous turns' context found in the prefix cache
    requests = {}
    for path in logs.glob("replica-*.jsonl"):
        for entry in map(json.loads, path.read_text().splitlines()):
            assert entry["rid"] not in requests  # no rid sent twice: no retry
            requests[entry["rid"]] = entry
    assert len(requests) == 32 * 4 * 3
    by_seed = {e["seed"]: e["rid"] for e in requests.values()}
    for row in rows:
        i = int(row["id"][1:])
        for m in range(4):
            aid = by_seed[episode_seed(0, row["id"], m)]  # the first turn's rid
            context, tool_tokens = len(PROMPT), 0
            for t, turn in enumerate(member_turns(i, m)):
                e = requests[turn_rid(aid, t)]
                assert e["prompt_tokens"] == context and e["tokens"] == turn["gen"]
                if t > 0:  # the previous request's prompt and output were cached:
                    # all of this one's context but the tool's output
                    assert e["cached_tokens"] == context - tool_tokens, (row["id"], m, t)
                context += turn["gen"] + turn["tool_tokens"]
                tool_tokens = turn["tool_tokens"]


def test_a_worker_killed_in_a_tool_wait_is_retried_from_turn_1_and_delivered_once(
        r, redis_url, tmp_path):
    turns = [{"gen": 30, "tool_s": 0.05, "tool_tokens": 5},
             {"gen": 40, "tool_s": 6.0, "tool_tokens": 5},  # killed in this wait
             {"gen": 20}]
    toml = write_worker_farm(tmp_path / "farm.toml", redis_url, group_size=1, slots=1, lease=2,
                             workflow={"name": "controlled_turns"})
    with ExitStack() as stack:
        farm = WorkerFarm(stack, toml, replicas=1, step_ms=1.0)
        ledger = Ledger.from_config(r, farm.config)
        reconciler = Reconciler(ledger, farm.config)
        prompt = {"id": "k", "input_ids": PROMPT, "member_turns": [turns]}
        ledger.submit([("k", json.dumps(prompt).encode())])
        (first,) = ledger.admit().attempt_ids
        flush_outbox(r, ledger.keys)
        # in the second tool wait: the ledger knows it, and the rid of turn 1
        wait_for(lambda: (a := ledger.attempt(first)) and a.tool and a.rid, 30, "the wait")
        assert ledger.attempt(first).rid == turn_rid(first, 1)
        status = farm_status(r, farm.config, redis_url=redis_url)
        assert (status["active_episodes"], status["tool_waits"]) == (1, 1)
        pid = next(w.pid for w in Worker.all(connection=r, serializer=JSONSerializer))
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: reconciler.tick(scan_jobs=False).doubted, 30, "doubt")
        assert ledger.counters()["reserved"] == 1 and ledger.counters().get("tool_wait", 0) == 0
        # the supervisor restarts the process; its resolver aborts the attempt's
        # requests, probes turn 1's rid and retries from turn 1 with the same seed
        wait_for(lambda: ledger.counters().get("finished", 0) == 1, 60, "the retry",
                 tick=lambda: (reconciler.tick(scan_jobs=False), flush_outbox(r, ledger.keys)))
        log = list(farm.engines[0].server.model.log)
    assert ledger.attempt(first).state == "stopped"
    retry = ledger.current_attempt("k", 0)[0]
    assert retry != first
    rids = [e["rid"] for e in log]
    # the killed attempt's two turns, the probe of turn 1's rid, then all three again
    assert rids == [first, turn_rid(first, 1), turn_rid(first, 1),
                    retry, turn_rid(retry, 1), turn_rid(retry, 2)]
    assert log[2]["tokens"] == 0 and log[2]["started"] >= log[1]["ended"]  # the probe
    result = decode_result(ledger.result("k", 0), 1 << 20)
    seed = episode_seed(0, "k", 0)
    expected = [*token_ids(seed, 0, 30), *token_ids(episode_seed(seed, "turn", 1), 0, 40),
                *token_ids(episode_seed(seed, "turn", 2), 0, 20)]
    assert result.output_ids == expected and result.turn_lengths == [30, 40, 20]
    r.xgroup_create(ledger.keys.events, EVENTS_GROUP, id="0")
    [(_, entries)] = r.xreadgroup(EVENTS_GROUP, "test", {ledger.keys.events: ">"})
    ((entry_id, fields),) = entries
    assert fields[b"group"] == b"k"
    assert ledger.judge("k", accept=True, entry_id=entry_id.decode()).status == "accepted"
    delivery = ledger.pop_batch("trainer")
    assert delivery is not None and delivery.batch.groups == ["k"]
    assert ledger.ack("trainer", delivery.batch.id).status == "acked"
    assert ledger.pop_batch("trainer") is None  # delivered once
    c = ledger.counters()
    assert (c["finished"], c.get("ignored", 0), c["retries:lease_expired"]) == (1, 0, 1)
    assert examine(r, ledger.keys, 1).ok
