"""The reconciler marks doubt, re-queues lost jobs and applies the doubt timeout."""

from __future__ import annotations

import msgspec

from queue_rollout.collector.reconciler import Reconciler
from queue_rollout.config import Config
from queue_rollout.ledger.core import Ledger
from queue_rollout.ledger.jobs import episode_queue, flush_outbox
from testkit import trivial_prompts


def make(r, clock, **timeouts) -> tuple[Ledger, Reconciler]:
    config = msgspec.convert({"farm": {"name": "rc"}, "timeouts": timeouts,
                              "rollout": {"group_size": 2, "max_concurrent_samples": 4}}, Config)
    ledger = Ledger(r, "rc", config.rollout, clock=clock)
    return ledger, Reconciler(ledger, config)


def test_an_expired_lease_makes_the_attempt_doubtful_and_keeps_its_slot(r, clock):
    """A worker gone silent (killed, cut off): its attempt turns doubtful and keeps its
    slot, with no second attempt yet (I5)."""
    ledger, rec = make(r, clock, lease=30)
    ledger.submit(trivial_prompts(1))
    a, b = ledger.admit().attempt_ids
    ledger.start(a, "w", "r", "boot", 30)
    ledger.start(b, "w", "r", "boot", 30)
    clock.advance(20)
    ledger.progress(b, "w", 1, 30)  # b's worker is alive
    clock.advance(15)
    report = rec.tick(scan_jobs=False)
    assert report.doubted == [a]
    c = ledger.counters()
    assert (c["doubtful"], c["running"], c["reserved"]) == (1, 1, 2)
    assert r.llen(ledger.keys.outbox) == 2  # no second attempt


def test_the_doubt_timeout_declares_lost_loudly_and_retries(r, clock, caplog):
    """A doubt nobody can settle still ends in a retry: the episode is not lost (I8)."""
    ledger, rec = make(r, clock, doubt=100)
    ledger.submit(trivial_prompts(1))
    a, _ = ledger.admit().attempt_ids
    ledger.start(a, "w", "r", "boot", 30)
    ledger.mark_doubtful(a, "lease_expired")
    clock.advance(99)
    assert rec.tick(scan_jobs=False).lost == []
    clock.advance(2)
    assert rec.tick(scan_jobs=False).lost == [a]
    assert f"attempt {a}: doubtful for over 100s, declared lost" in caplog.text
    assert ledger.counters()["retries:doubt_timeout"] == 1
    assert ledger.finish(a, 0, b"late").reason == "superseded attempt"


def test_a_queued_attempt_whose_job_vanished_goes_back_to_the_outbox(r, clock):
    ledger, rec = make(r, clock)
    ledger.submit(trivial_prompts(1))
    a, b = ledger.admit().attempt_ids
    assert rec.tick().requeued == []  # both still in the outbox
    flush_outbox(r, ledger.keys)
    assert rec.tick().requeued == []  # both waiting in RQ
    queue = episode_queue(r, ledger.keys)
    r.lrem(queue.key, 1, a)  # lost (e.g. RQ data lost with Redis)
    clock.now += 29
    assert rec.tick().requeued == []  # queued for less than a lease: not looked at yet
    clock.now += 2
    assert rec.tick().requeued == [a]
    assert flush_outbox(r, ledger.keys) == 1
    assert sorted(queue.job_ids) == sorted([a, b])


def test_a_job_stranded_in_the_intermediate_list_is_handed_back(r, clock):
    """A worker that died between taking a job (into RQ's intermediate list) and starting
    its attempt leaves it there: after a lease the attempt is enqueued again."""
    ledger, rec = make(r, clock)
    ledger.submit(trivial_prompts(1))
    a, b = ledger.admit().attempt_ids
    flush_outbox(r, ledger.keys)
    queue = episode_queue(r, ledger.keys)
    assert r.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT").decode() == a
    clock.now += 31
    assert rec.tick().requeued == [a]  # b still waits in its queue: left alone
    assert r.lrange(queue.intermediate_queue_key, 0, -1) == []
    assert flush_outbox(r, ledger.keys) == 1
    assert sorted(queue.job_ids) == sorted([a, b])


def test_the_intermediate_list_is_swept_of_jobs_whose_attempt_ended(r, clock):
    """A worker that died after its attempt ended leaves the id in the intermediate
    list; a running attempt's id (a live worker holds it) stays."""
    ledger, rec = make(r, clock)
    ledger.submit(trivial_prompts(1))
    a, b = ledger.admit().attempt_ids
    flush_outbox(r, ledger.keys)
    queue = episode_queue(r, ledger.keys)
    for _ in (a, b):
        r.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
    r.rpush(queue.intermediate_queue_key, "no-such-attempt")
    ledger.start(a, "w", "r", "boot", 30)
    ledger.finish(a, 0, b"done")
    ledger.start(b, "w", "r", "boot", 30)
    assert rec.tick().requeued == []
    assert [x.decode() for x in r.lrange(queue.intermediate_queue_key, 0, -1)] == [b]

