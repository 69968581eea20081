"""Ledger changes that wait for replicas: WAIT rides on the script's connection, a
shortfall or a lost answer resends the call under the same receipt, and a resent call
is applied once and answers what it answered first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from queue_rollout.config import RolloutConfig
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.durable import WaitPolicy
from queue_rollout.ledger.embedded import EmbeddedRedis, replica_of
from queue_rollout.ledger.keys import Keys
from queue_rollout.ledger.scripts import Scripts
from testkit import trivial_prompts, wait_for

ROLLOUT = RolloutConfig(group_size=2, batch_size=1, max_concurrent_rollouts=4)


class Pair:
    def __init__(self, root: Path) -> None:
        self.primary = EmbeddedRedis(root / "primary", write_url=False)
        self.primary.start()
        self.replica = replica_of(self.primary, root / "replica")

    def linked(self) -> bool:
        client = self.primary.client()
        try:
            info = client.info("replication")
        finally:
            client.close()
        return bool(info.get("slave0", {}).get("state") == "online")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    p = Pair(tmp_path_factory.mktemp("pair"))
    yield p
    p.replica.stop()
    p.primary.stop()


@pytest.fixture
def primary(pair: Pair) -> Iterator[redis.Redis]:
    if not pair.replica.alive():
        pair.replica.restart()
    wait_for(pair.linked, 20, "the replica to sync")
    client = redis.Redis.from_url(pair.primary.url)
    client.flushall()
    yield client
    client.close()


def _ledger(client: redis.Redis, replicas: int = 1, timeout_s: float = 0.2) -> Ledger:
    return Ledger(client, "d", ROLLOUT, wait=WaitPolicy(replicas, timeout_s))


def test_a_change_returns_once_the_replica_holds_it_and_leaves_no_receipt(
        primary: redis.Redis, pair: Pair) -> None:
    ledger = _ledger(primary)
    assert ledger.submit(trivial_prompts(3)).count == 3
    admission = ledger.admit()
    assert admission.status == "admitted"
    assert ledger.durable is not None and ledger.durable.last_acked == 1
    replica = pair.replica.client()
    try:  # what the caller acted on is on the replica already
        assert replica.hget(Keys("d").groups, admission.group_id) is not None
    finally:
        replica.close()
    assert len(list(primary.scan_iter(match=Keys("d").receipt("*")))) == 1  # the admission's
    ledger.start(admission.attempt_ids[0], "w", "r", "b", 30)  # deletes earlier receipts
    assert list(primary.scan_iter(match=Keys("d").receipt("*"))) == []  # start needs none


def test_the_same_call_sent_again_is_applied_once_with_the_first_answer(
        primary: redis.Redis) -> None:
    keys = Keys("d")
    scripts = Scripts(primary, receipts=True)
    Ledger(primary, "d", ROLLOUT).submit(trivial_prompts(2))
    call_keys = [keys.counters, keys.state, keys.pending, keys.groups, keys.attempts,
                 keys.outbox, keys.replica_free, keys.replica_load, keys.placed,
                 keys.refusals, keys.history, keys.history_index, keys.receipt("same")]
    args: list[object] = ["1.0", 2, 1, 8, 2, "group", "any", 10, 60, "a1", "a2", "0", 60]
    first = scripts.call("admit", call_keys, args)
    again = scripts.call("admit", call_keys, [*args[:-4], "b1", "b2", "1", 60])
    assert again == first
    assert int(primary.hget(keys.counters, "admitted") or 0) == 1
    assert primary.llen(keys.pending) == 1
    assert 0 < primary.ttl(keys.receipt("same")) <= 60


@pytest.mark.e2e
def test_without_the_replica_a_change_holds_until_it_is_back(
        primary: redis.Redis, pair: Pair) -> None:
    ledger = _ledger(primary)
    ledger.submit(trivial_prompts(2))
    pair.replica.kill()
    answers = []
    caller = threading.Thread(target=lambda: answers.append(ledger.admit()), daemon=True)
    caller.start()
    caller.join(1.5)
    assert caller.is_alive() and not answers  # held: the admission is not acted on
    assert ledger.durable is not None and ledger.durable.last_acked == 0
    pair.replica.restart()
    caller.join(30)
    assert answers and answers[0].status == "admitted"
    counters = ledger.counters()  # resent every 0.2 s, applied once
    assert counters["admitted"] == 1 and counters["reserved"] == 2


def lose_first_answer(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every pipeline runs, but the first one's answer is lost on the way back; the
    answers, lost or not, are collected in the list returned."""
    real = redis.client.Pipeline.execute
    calls: list[object] = []

    def execute(self: redis.client.Pipeline, raise_on_error: bool = True) -> object:
        result = real(self, raise_on_error=raise_on_error)
        calls.append(result)
        if len(calls) == 1:
            raise redis.ConnectionError("connection lost after the script ran")
        return result

    monkeypatch.setattr(redis.client.Pipeline, "execute", execute)
    return calls


def test_an_answer_lost_on_the_way_back_is_sent_again_and_applied_once(
        primary: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = _ledger(primary)
    ledger.submit(trivial_prompts(2))
    assert ledger.durable is not None
    ledger.durable.scripts.load("admit")  # no NOSCRIPT round first, whatever ran before
    calls = lose_first_answer(monkeypatch)
    admission = ledger.admit()
    monkeypatch.undo()
    assert len(calls) == 2 and calls[0][-2] == calls[1][-2]  # the stored answer, again
    assert admission.status == "admitted"
    assert ledger.counters()["admitted"] == 1


def test_a_server_without_the_scripts_gets_them_again(primary: redis.Redis) -> None:
    ledger = _ledger(primary)
    ledger.submit(trivial_prompts(2))
    primary.script_flush()  # as a promoted replica or a restarted server
    assert ledger.admit().status == "admitted"


def test_answers_that_change_nothing_leave_no_receipt_and_renewals_never_wait(
        primary: redis.Redis, pair: Pair) -> None:
    ledger = _ledger(primary)
    ledger.submit(trivial_prompts(1))
    admission = ledger.admit()
    ledger.start(admission.attempt_ids[0], "w", "r", "b", 30)
    assert list(primary.scan_iter(match=Keys("d").receipt("*"))) == []  # start's own
    assert ledger.admit().status == "empty" and ledger.pop_batch("t") is None
    assert list(primary.scan_iter(match=Keys("d").receipt("*"))) == []
    pair.replica.kill()  # a lease renewal goes through without any replica
    assert ledger.progress(admission.attempt_ids[0], "w", 1, 30).status == "ok"


@pytest.mark.e2e
def test_a_lost_answer_then_a_server_without_the_scripts_still_applies_once(
        primary: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failover can do both: the answer is lost, and the promoted server has no
    scripts. The resend after loading them must still look for the receipt."""
    ledger = _ledger(primary)
    ledger.submit(trivial_prompts(2))
    assert ledger.durable is not None
    ledger.durable.scripts.load("admit")
    real = redis.client.Pipeline.execute
    calls = []

    def lose_answer_then_scripts(self: redis.client.Pipeline,
                                 raise_on_error: bool = True) -> object:
        result = real(self, raise_on_error=raise_on_error)
        calls.append(result)
        if len(calls) == 1:
            primary.script_flush()
            raise redis.ConnectionError("connection lost after the script ran")
        return result

    monkeypatch.setattr(redis.client.Pipeline, "execute", lose_answer_then_scripts)
    admission = ledger.admit()
    monkeypatch.undo()
    assert calls[0][-2][0] == b"admitted"
    assert isinstance(calls[1][-2], redis.exceptions.NoScriptError)
    assert admission.status == "admitted"
    counters = ledger.counters()
    assert counters["admitted"] == 1 and counters["reserved"] == 2


@pytest.mark.parametrize("lost", ["start", "finish"])
def test_an_episodes_calls_sent_again_answer_as_first_with_no_receipt_key(
        primary: redis.Redis, monkeypatch: pytest.MonkeyPatch, lost: str) -> None:
    """start and finish keep their receipt in the attempt record: the same call sent
    again answers what it answered first; another call is refused as a duplicate."""
    ledger = _ledger(primary)
    ledger.submit(trivial_prompts(1))
    ledger.set_version(3)
    admission = ledger.admit()
    aid = admission.attempt_ids[0]
    if lost == "finish":
        ledger.start(aid, "w", "r", "b", 30)
    assert ledger.durable is not None
    ledger.durable.scripts.load(lost)
    calls = lose_first_answer(monkeypatch)
    if lost == "start":
        answer = ledger.start(aid, "w", "r", "b", 30)
        monkeypatch.undo()
        assert (answer.status, answer.version, answer.prompt) == ("started", 3, b'{"prompt": "x"}')
        assert ledger.counters()["running"] == 1
        assert ledger.start(aid, "w", "r", "b", 30).reason == "duplicate start"
    else:
        answer = ledger.finish(aid, 0, b"r", output_tokens=5)
        monkeypatch.undo()
        assert answer.status == "recorded"
        counters = ledger.counters()
        assert counters["finished"] == 1 and counters["output_tokens"] == 5
        assert ledger.finish(aid, 0, b"r", output_tokens=5).reason == "duplicate result"
    assert len(calls) == 2 and calls[0][-2] == calls[1][-2]  # answered alike, twice
    assert list(primary.scan_iter(match=Keys("d").receipt("*"))) == []
