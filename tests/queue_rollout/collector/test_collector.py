"""The collector: admission, judgement from the events stream, leadership, failover."""

from __future__ import annotations

import json
import logging
import sys

import msgspec
import pytest
import redis

from queue_rollout.collector.loop import Collector
from queue_rollout.config import Config
from queue_rollout.ledger import cells
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.keys import EVENTS_GROUP
from queue_rollout.results import EpisodeResult, encode_result


def make(r, clock, acceptance=None, **rollout) -> tuple[Ledger, Config]:
    config = msgspec.convert({
        "farm": {"name": "c"}, "acceptance": acceptance or {},
        "rollout": {"group_size": 2, "batch_size": 1, "max_concurrent_samples": 4,
                    "max_staleness": 100, **rollout},
        "timeouts": {"leader_lease": 10}}, Config)
    return Ledger(r, "c", config.rollout, clock=clock), config


def submit(ledger: Ledger, n: int) -> None:
    ledger.submit((f"p{i}", json.dumps({"id": f"p{i}", "prompt": "x"}).encode())
                  for i in range(n))


def play(ledger: Ledger, aid: str, reward: float | None, *, failed: bool = False) -> None:
    a = ledger.attempt(aid)
    ledger.start(aid, "w", "r", "b", 30)
    result = EpisodeResult(member=a.member, output_ids=[1], logprobs=[-0.1], version_runs=[(0, 1)],
                           finish_reason="length", reward=reward, error="boom" if failed else "")
    ledger.finish(aid, a.member, encode_result(result), output_tokens=1,
                  outcome="failed" if failed else "finished")


def attempts(ledger: Ledger, gid: str) -> list[str]:
    return ledger.group(gid).attempt_ids


def test_admits_to_capacity_dispatches_and_accepts_complete_groups(r, clock):
    ledger, config = make(r, clock)
    submit(ledger, 5)
    collector = Collector(ledger, config, name="c1")
    report = collector.step()
    assert (report.leader, report.admitted, report.blocked) == (True, 2, "capacity")
    assert r.llen(ledger.keys.outbox) == 0 and r.llen("rq:queue:qr-c-episodes") == 4
    for aid in attempts(ledger, "p0"):
        play(ledger, aid, 1.0)
    report = collector.step()
    assert report.judged == {"p0": ""} and report.admitted == 1
    assert ledger.group("p0").state == "accepted" and r.llen(ledger.keys.ready) == 1


@pytest.mark.parametrize("acceptance,rewards,failed,reason", [
    ({"reject_zero_variance": True}, [1.0, 1.0], False, "zero_variance"),
    ({"reject_zero_variance": True}, [1.0, 0.0], False, ""),
    ({"reject_zero_variance": True}, [None, None], False, ""),  # no rewards: nothing to judge
    ({}, [1.0, 0.0], True, "failed_members"),
    ({"max_failed_members": 1}, [1.0, 0.0], True, ""),
])
def test_acceptance_rules(r, clock, acceptance, rewards, failed, reason):
    ledger, config = make(r, clock, acceptance=acceptance)
    submit(ledger, 1)
    collector = Collector(ledger, config, name="c1")
    collector.step()
    a0, a1 = attempts(ledger, "p0")
    play(ledger, a0, rewards[0])
    play(ledger, a1, rewards[1], failed=failed)
    assert collector.step().judged == {"p0": reason}
    if reason:
        assert ledger.counters()[f"rejected:{reason}"] == 1


def test_a_plugin_may_reject_with_a_reason(r, clock, tmp_path, monkeypatch, caplog):
    (tmp_path / "my_rules.py").write_text(
        "def only_long(group):\n"
        "    return True if group.prompt.get('keep') else 'prompt not marked keep'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    caplog.set_level(logging.INFO, logger="queue_rollout.collector.loop")
    ledger, config = make(r, clock, acceptance={"plugin": "my_rules:only_long"})
    ledger.submit([("k", b'{"id": "k", "prompt": "x", "keep": true}'),
                   ("d", b'{"id": "d", "prompt": "x"}')])
    collector = Collector(ledger, config, name="c1")
    collector.step()
    for gid in ("k", "d"):
        for aid in attempts(ledger, gid):
            play(ledger, aid, 0.5)
    assert collector.step().judged == {"k": "", "d": "plugin"}
    assert "group d rejected: plugin (prompt not marked keep)" in caplog.text
    sys.modules.pop("my_rules", None)


def test_only_the_leader_acts_and_a_standby_takes_over_after_the_lease(r, clock):
    ledger, config = make(r, clock)
    submit(ledger, 3)
    first = Collector(ledger, config, name="first")
    second = Collector(ledger, config, name="second")
    assert first.step().leader and not second.step().leader
    assert ledger.counters()["admitted"] == 2
    clock.advance(5)
    assert first.step().leader and not second.step().leader  # renewed
    clock.advance(11)  # the first one died: its lease ran out
    assert second.step().leader and not first.step().leader


def test_a_restarted_collector_judges_what_it_read_but_did_not_finish_once(r, clock):
    ledger, config = make(r, clock)
    submit(ledger, 2)
    old = Collector(ledger, config, name="old")
    old.step()
    for gid in ("p0", "p1"):
        for aid in attempts(ledger, gid):
            play(ledger, aid, 1.0)
    # the old collector read both completions, then died before judging them
    r.xreadgroup(EVENTS_GROUP, "old", {ledger.keys.events: ">"})
    assert r.xpending(ledger.keys.events, EVENTS_GROUP)["pending"] == 2
    clock.advance(11)  # the old leader's lease ran out
    new = Collector(ledger, config, name="new")
    assert new.step().judged == {"p0": "", "p1": ""}
    assert r.xpending(ledger.keys.events, EVENTS_GROUP)["pending"] == 0
    assert new.step().judged == {}
    assert ledger.counters()["accepted"] == 2


def test_an_unreadable_result_does_not_block_the_collector(r, clock, caplog):
    ledger, config = make(r, clock, acceptance={"reject_zero_variance": True})
    submit(ledger, 1)
    collector = Collector(ledger, config, name="c1")
    collector.step()
    a0, a1 = attempts(ledger, "p0")
    play(ledger, a0, 1.0)
    ledger.start(a1, "w", "r", "b", 30)
    ledger.finish(a1, 1, b"\xc1 not msgpack", output_tokens=1)
    assert collector.step().judged == {"p0": "failed_members"}  # unreadable counts as failed
    assert "group p0 member 1: unreadable result" in caplog.text


def test_cell_collectors_share_the_control_redis_lead_budget_and_verdicts(redis_url, clock):
    """A farm of two cells, the control Redis and the cells databases of one server:
    one leader lease for all cells, one staleness budget (one group in flight here)."""
    base = redis_url.rsplit("/", 1)[0]
    clients = [redis.Redis.from_url(f"{base}/{db}") for db in (1, 2, 3)]
    try:
        (control, config), (a, _), (b, _) = (make(c, clock, max_staleness=0) for c in clients)
        for name, cell in (("a", a), ("b", b)):
            cell.submit([(f"{name}{i}", json.dumps({"prompt": "x"}).encode()) for i in range(2)])
        on_a = Collector(a, config, name="c1", control=control, cell="a")
        on_b = Collector(b, config, name="c1", control=control, cell="b")
        assert on_a.step().admitted == 1
        assert not Collector(b, config, name="c2", control=control, cell="b").step().leader
        assert on_b.step().blocked == "staleness"
        for aid in attempts(a, "a0"):
            play(a, aid, 1.0)
        assert on_a.step().judged == {"a0": ""}
        assert control.ready_groups() == a.ready_groups() == ["a0"]
        assert on_b.step().blocked == "staleness"  # accepted, not consumed yet
        delivery = control.pop_batch("trainer")
        assert delivery is not None
        assert cells.ack(control, {"a": a, "b": b}, "trainer", delivery.batch.id,
                         delivery.batch.groups).count == 1
        control.set_version(1)
        report = on_b.step()
        assert (report.admitted, report.blocked) == (1, "staleness")
        assert b.group("b0").version == 1 and control.group("b0").cell == "b"
        assert a.group("a0").state == "consumed"
    finally:
        for c in clients:
            c.close()
