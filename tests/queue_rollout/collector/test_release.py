"""timeouts.batch_ack: the collector releases a batch left unacknowledged too long."""

from __future__ import annotations

import json

import msgspec

from queue_rollout.collector.loop import Collector
from queue_rollout.config import Config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.results import EpisodeResult, encode_result


def make(r, clock, batch_ack: int) -> tuple[Ledger, Config]:
    config = msgspec.convert({
        "farm": {"name": "cr"},
        "rollout": {"group_size": 1, "batch_size": 1, "max_concurrent_samples": 4},
        "timeouts": {"batch_ack": batch_ack}}, Config)
    return Ledger(r, "cr", config.rollout, clock=clock), config


def two_ready(ledger: Ledger, collector: Collector) -> None:
    ledger.submit((f"p{i}", json.dumps({"prompt": "x"}).encode()) for i in range(2))
    collector.step()
    for raw in ledger.client.hkeys(ledger.keys.attempts):
        aid = raw.decode()
        ledger.start(aid, "w", "r", "b", 30)
        result = EpisodeResult(member=0, output_ids=[1], logprobs=[-0.1],
                               version_runs=[(0, 1)], finish_reason="length", reward=1.0)
        ledger.finish(aid, 0, encode_result(result), output_tokens=1)
    collector.step()
    assert ledger.client.llen(ledger.keys.ready) == 2


def test_a_batch_past_the_ack_timeout_is_released_once_and_the_young_one_kept(r, clock):
    ledger, config = make(r, clock, batch_ack=60)
    collector = Collector(ledger, config, name="c")
    two_ready(ledger, collector)
    old = ledger.pop_batch("gone")
    clock.advance(30)
    young = ledger.pop_batch("slow")
    assert old is not None and young is not None

    clock.advance(30)  # old: 60 s, not past the limit yet
    assert collector.release_overdue() == []
    clock.advance(1)
    assert collector.release_overdue() == [old.batch.id]
    assert [b.id for b in ledger.held()] == [young.batch.id]
    assert ledger.counters()["released"] == 1
    assert examine(r, ledger.keys, 1).ok

    again = ledger.pop_batch("next")
    assert again is not None and again.redelivered and again.batch.groups == old.batch.groups
    assert ledger.ack("gone", old.batch.id).status == "refused"
    assert ledger.ack("slow", young.batch.id).status == "acked"
    # the redelivered batch's own clock starts at its delivery
    clock.advance(30)
    collector.step()
    assert [b.id for b in ledger.held()] == [again.batch.id]
    assert ledger.ack("next", again.batch.id).status == "acked"
    assert ledger.counters()["consumed"] == 2
    assert examine(r, ledger.keys, 1).ok


def test_without_an_ack_timeout_a_batch_stays_held(r, clock):
    ledger, config = make(r, clock, batch_ack=0)
    collector = Collector(ledger, config, name="c")
    two_ready(ledger, collector)
    held = ledger.pop_batch("gone")
    clock.advance(10**6)
    collector.step()
    assert collector.release_overdue() == []
    assert [b.id for b in ledger.held()] == [held.batch.id]
