"""Releasing a gone consumer's batch: the one exception to "a group is delivered once".
The batch goes back whole to the head of the ready groups, the next consumer to pop
gets it marked redelivered under the version of its first delivery, the old
consumer's late ack is refused and counted, each group is still consumed once, and
the doctor finds nothing wrong."""

from __future__ import annotations

import pytest
import redis

from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.doctor import examine
from queue_rollout.ledger.scripts import Scripts
from testkit import trivial_prompts


def ready_groups(ledger: Ledger, n: int, prefix: str = "p") -> list[str]:
    """Submit, run, complete and accept *n* groups; their ids in ready order."""
    assert ledger.submit(trivial_prompts(n, prefix)).status == "submitted"
    gids = []
    for _ in range(n):
        admission = ledger.admit()
        assert admission.status == "admitted", admission
        for m, aid in enumerate(admission.attempt_ids):
            assert ledger.start(aid, "w", "r0", "boot0", 30).status == "started"
            assert ledger.finish(aid, m, b"result", output_tokens=3).status == "recorded"
        assert ledger.judge(admission.group_id, accept=True).status == "accepted"
        gids.append(admission.group_id)
    return gids


def staleness_observed(r: redis.Redis, ledger: Ledger) -> list[float]:
    return [float(f[b"v"]) for _, f in r.xrange(ledger.keys.observations)
            if f[b"k"] == b"staleness"]


def assert_doctor_clean(r: redis.Redis, ledger: Ledger) -> None:
    report = examine(r, ledger.keys, ledger.rollout.batch_size)
    assert report.ok, report.problems


@pytest.fixture
def ledger(make_ledger) -> Ledger:
    return make_ledger(group_size=2, batch_size=2, max_concurrent_samples=16,
                       max_staleness=4)


def test_a_released_batch_goes_whole_to_another_consumer_and_the_late_ack_is_refused(
        ledger, r, clock):
    gids = ready_groups(ledger, 4)
    first = ledger.pop_batch("gone")
    assert first is not None and not first.redelivered
    assert first.batch.groups == gids[:2] and first.batch.version == 0
    ledger.set_version(3)  # training went on elsewhere meanwhile
    clock.advance(60)

    released = ledger.release("gone")
    assert released is not None and released.id == first.batch.id
    assert released.groups == gids[:2]
    assert ledger.counters()["released"] == 1
    assert ledger.held() == []
    assert [ledger.group(g).state for g in gids[:2]] == ["accepted", "accepted"]
    assert_doctor_clean(r, ledger)

    # they go first, whole, to whichever consumer pops next
    again = ledger.pop_batch("next")
    assert again is not None and again.redelivered
    assert again.batch.groups == gids[:2]
    assert again.batch.id != first.batch.id
    assert again.batch.version == 0  # the version of their first delivery, not 3
    assert_doctor_clean(r, ledger)

    late = ledger.ack("gone", first.batch.id)
    assert (late.status, late.reason) == ("refused", "released")
    assert late.refused and not late.ignored
    assert ledger.counters()["acks_refused"] == 1
    assert ledger.counters().get("consumed", 0) == 0  # the refused ack consumed nothing
    assert ledger.held()[0].id == again.batch.id  # nor touched the new holder's batch

    assert ledger.ack("next", again.batch.id).status == "acked"
    assert ledger.counters()["consumed"] == 2
    # a group released keeps the staleness of its first delivery: 0 - 0, not 3 - 0
    assert staleness_observed(r, ledger) == [0.0, 0.0]
    assert_doctor_clean(r, ledger)

    # the rest is delivered as usual: each group consumed exactly once
    rest = ledger.pop_batch("gone")
    assert rest is not None and not rest.redelivered
    assert rest.batch.groups == gids[2:] and rest.batch.version == 3
    assert ledger.ack("gone", rest.batch.id).status == "acked"
    assert ledger.counters()["consumed"] == 4
    assert staleness_observed(r, ledger) == [0.0, 0.0, 3.0, 3.0]
    assert all(ledger.group(g).state == "consumed" for g in gids)
    assert ledger.counters()["acks_refused"] == 1
    assert ledger.pop_batch("next") is None
    assert_doctor_clean(r, ledger)


def test_a_batch_released_twice_keeps_its_first_delivery_version(ledger, r):
    gids = ready_groups(ledger, 2)
    first = ledger.pop_batch("a")
    ledger.set_version(1)
    assert ledger.release("a") is not None
    second = ledger.pop_batch("b")
    ledger.set_version(2)
    assert ledger.release("b") is not None
    third = ledger.pop_batch("c")
    assert third is not None and third.redelivered
    assert third.batch.groups == gids and third.batch.version == 0
    assert ledger.group(gids[0]).released == 2 and ledger.group(gids[0]).delivered_version == 0
    assert ledger.ack("a", first.batch.id).status == "refused"
    assert ledger.ack("b", second.batch.id).status == "refused"
    assert ledger.counters()["acks_refused"] == 2
    assert ledger.ack("c", third.batch.id).status == "acked"
    assert ledger.counters()["consumed"] == 2
    assert_doctor_clean(r, ledger)


def test_the_released_consumer_itself_may_take_the_batch_again(ledger, r):
    gids = ready_groups(ledger, 2)
    first = ledger.pop_batch("t")
    ledger.release("t")
    again = ledger.pop_batch("t")
    assert again is not None and again.redelivered and again.batch.groups == gids
    assert ledger.ack("t", first.batch.id).status == "refused"  # the old delivery
    assert ledger.ack("t", again.batch.id).status == "acked"
    assert ledger.counters()["consumed"] == 2
    assert_doctor_clean(r, ledger)


def test_releasing_nothing_changes_nothing(ledger, r, redis_snapshot):
    ready_groups(ledger, 2)
    held = ledger.pop_batch("t")
    assert held is not None
    before = redis_snapshot()
    assert ledger.release("nobody") is None
    assert ledger.release("t", batch_id="another-batch") is None  # acked meanwhile
    assert redis_snapshot() == before
    assert ledger.release("t", batch_id=held.batch.id) is not None


def test_released_groups_go_before_groups_that_were_ready(ledger, r):
    gids = ready_groups(ledger, 2)
    ledger.pop_batch("gone")
    newer = ready_groups(ledger, 2, prefix="late")
    ledger.release("gone")
    assert r.lrange(ledger.keys.ready, 0, -1) == [g.encode() for g in gids + newer]
    assert ledger.pop_batch("next").batch.groups == gids
    assert_doctor_clean(r, ledger)


def test_release_applied_once_when_its_call_is_sent_again(ledger, r):
    """With replicas to wait for, a resent release answers as it did and changes nothing."""
    ready_groups(ledger, 2)
    held = ledger.pop_batch("t")
    k = ledger.keys
    scripts = Scripts(r, receipts=True)
    keys = [k.counters, k.groups, k.ready, k.batches, k.released, k.receipt("x")]
    first = scripts.call("release", keys, ["1.0", "t", "", 10, "0", 60])
    again = scripts.call("release", keys, ["1.0", "t", "", 10, "1", 60])
    assert first[0] == again[0] == b"released" and first == again
    assert r.llen(k.ready) == 2 and ledger.counters()["released"] == 1
    assert ledger.ack("t", held.batch.id).status == "refused"
