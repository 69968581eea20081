"""A small farm end to end: real Redis, simulated replicas, `queue-rollout worker`
processes; the test plays the collector (admission, outbox, reconciler ticks)."""

from __future__ import annotations

import json
import os
import signal
from contextlib import ExitStack

import pytest
from rq.serializers import JSONSerializer
from rq.worker import Worker

from queue_rollout.collector.reconciler import Reconciler
from queue_rollout.engines.base import episode_seed
from queue_rollout.engines.sglang import SGLangClient
from queue_rollout.lab.sim.server import ThreadedSimEngine
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.jobs import episode_queue, flush_outbox
from queue_rollout.ledger.keys import EVENTS_GROUP
from queue_rollout.results import decode_result
from testkit import WorkerFarm as Farm
from testkit import wait_for
from testkit import write_worker_farm as write_toml

pytestmark = pytest.mark.e2e


def test_32_groups_of_4_delivered_whole_with_exact_lengths_and_one_result_each(
        r, redis_url, tmp_path):
    toml = write_toml(tmp_path / "farm.toml", redis_url, group_size=4, slots=2, lease=10)
    with ExitStack() as stack:
        farm = Farm(stack, toml, replicas=2, step_ms=0.2)
        ledger = Ledger.from_config(r, farm.config)
        lengths = {f"g{i:02d}": [10 + (i * 7 + m * 13) % 90 for m in range(4)] for i in range(32)}
        ledger.submit((gid, json.dumps({"id": gid, "prompt": "x", "member_lengths": ls}).encode())
                      for gid, ls in lengths.items())

        def admit() -> None:
            while ledger.admit().status == "admitted":
                pass
            flush_outbox(r, ledger.keys)

        wait_for(lambda: ledger.counters().get("finished", 0) == 128, 120, "128 episodes", admit)
    # play the collector and the trainer: judge each completion once, take B=1 batches
    r.xgroup_create(ledger.keys.events, EVENTS_GROUP, id="0")
    [(_, entries)] = r.xreadgroup(EVENTS_GROUP, "test", {ledger.keys.events: ">"})
    assert sorted(f[b"group"].decode() for _, f in entries) == sorted(lengths)
    for entry_id, fields in entries:
        verdict = ledger.judge(fields[b"group"].decode(), accept=True, entry_id=entry_id.decode())
        assert verdict.status == "accepted"
    delivered = []
    while (delivery := ledger.pop_batch("trainer")) is not None:
        (gid,) = delivery.batch.groups  # exactly B = 1 group, whole
        for m, want in enumerate(lengths[gid]):
            result = decode_result(ledger.result(gid, m), 1 << 20)
            assert len(result.output_ids) == want and result.member == m
        assert ledger.ack("trainer", delivery.batch.id).status == "acked"
        delivered.append(gid)
    assert sorted(delivered) == sorted(lengths)  # each group delivered once
    c = ledger.counters()
    assert (c["finished"], c.get("failed", 0), c["reserved"], c.get("doubtful", 0)) == (
        128, 0, 0, 0)
    assert (c["consumed"], c.get("ignored", 0)) == (32, 0)  # no result was recorded twice
    assert c["output_tokens"] == sum(map(sum, lengths.values()))
    assert examine(r, ledger.keys, ledger.rollout.batch_size).ok


def test_a_long_episode_is_never_taken_for_abandoned_while_its_worker_lives(r, redis_url, tmp_path):
    toml = write_toml(tmp_path / "farm.toml", redis_url, group_size=1, slots=1, lease=2)
    with ExitStack() as stack:
        farm = Farm(stack, toml, replicas=1, step_ms=2.0)  # 15,000 tokens: 30 s, 15 leases
        ledger = Ledger.from_config(r, farm.config)
        reconciler = Reconciler(ledger, farm.config)
        ledger.submit([("long", b'{"id": "long", "prompt": "x", "member_lengths": [15000]}')])
        (aid,) = ledger.admit().attempt_ids
        flush_outbox(r, ledger.keys)
        wait_for(lambda: ledger.counters().get("finished", 0) == 1, 90, "the long episode",
                 tick=lambda: reconciler.tick(scan_jobs=False))
    c = ledger.counters()
    assert "doubts:lease_expired" not in c and c.get("retries:doubt_timeout", 0) == 0
    # its job was deleted once the attempt finished: in no RQ list, no registry
    queue = episode_queue(r, ledger.keys)
    assert queue.fetch_job(aid) is None and not r.exists(f"rq:job:{aid}")
    assert r.lpos(queue.key, aid) is None and r.lpos(queue.intermediate_queue_key, aid) is None
    assert queue.failed_job_registry.count == 0


def test_sigkill_mid_episode_doubt_keeps_the_slot_until_the_stop_is_confirmed(
        r, redis_url, tmp_path):
    toml = write_toml(tmp_path / "farm.toml", redis_url, group_size=1, slots=1, lease=2)
    with ExitStack() as stack:
        farm = Farm(stack, toml, replicas=1, step_ms=2.0)
        ledger = Ledger.from_config(r, farm.config)
        reconciler = Reconciler(ledger, farm.config)
        ledger.submit([("k", b'{"id": "k", "prompt": "x", "member_lengths": [2000]}')])
        (first,) = ledger.admit().attempt_ids
        flush_outbox(r, ledger.keys)
        wait_for(lambda: (a := ledger.attempt(first)) and a.state == "running", 30, "start")
        # started in the ledger before it is sent: killed once the replica runs it
        model = farm.engines[0].server.model
        wait_for(lambda: first in model.running, 30, "the request on the replica")
        pid = next(w.pid for w in Worker.all(connection=r, serializer=JSONSerializer))
        os.kill(pid, signal.SIGKILL)
        # the replica still runs the request: the lease expires, the slot stays
        wait_for(lambda: reconciler.tick(scan_jobs=False).doubted, 30, "doubt")
        assert ledger.counters()["reserved"] == 1
        assert r.llen(ledger.keys.outbox) == 0  # no second attempt yet
        # the supervisor restarts the process and its resolver confirms the stop
        wait_for(lambda: ledger.counters().get("finished", 0) == 1, 60, "the retry",
                 tick=lambda: (reconciler.tick(scan_jobs=False), flush_outbox(r, ledger.keys)))
        engine = farm.engines[0]
        log = engine.server.model.log
    assert ledger.attempt(first).state == "stopped"
    retry_aid = ledger.current_attempt("k", 0)[0]
    assert retry_aid != first
    runs: dict[str, list[dict]] = {}
    for entry in log:
        runs.setdefault(entry["rid"], []).append(entry)
    # the request ended (aborted when its client died, as SGLang does), then the probe
    # with the same rid was accepted: that confirmation came before any retry ran
    original, probe = runs[first]
    assert original["finish"] == "abort" and 0 < original["tokens"] < 2000
    assert (probe["finish"], probe["tokens"]) == ("length", 0)
    (retry_run,) = runs[retry_aid]
    assert retry_run["started"] >= probe["ended"] >= original["ended"]
    result = decode_result(ledger.result("k", 0), 1 << 20)
    with ThreadedSimEngine(slots=1, step_ms=0.05) as fresh:
        expected = SGLangClient(fresh.url).generate(
            "ref", text="x", timeout=10, sampling_params={
                "max_new_tokens": 2000, "ignore_eos": True,
                "sampling_seed": episode_seed(0, "k", 0)})
    assert result.output_ids == expected.output_ids  # same seed, same tokens
    assert ledger.counters()["retries:lease_expired"] == 1
