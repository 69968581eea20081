"""The outbox: every admitted attempt becomes exactly one RQ job: its id in the queue."""

from __future__ import annotations

from queue_rollout.ledger.outbox import episode_queue, flush_outbox
from testkit import trivial_prompts


def test_outbox_enqueues_each_attempt_once_with_only_its_id(make_ledger, r):
    ledger = make_ledger(group_size=4, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    admission = ledger.admit()
    assert flush_outbox(r, ledger.keys) == 4
    assert r.llen(ledger.keys.outbox) == 0
    queue = episode_queue(r, ledger.keys)
    assert queue.job_ids == list(admission.attempt_ids)  # in order, at the tail
    # a job is its id and nothing more: no record, no payload anyone could forge to run
    assert not any(r.exists(f"rq:job:{aid}") for aid in admission.attempt_ids)
    assert queue.key.encode() in r.smembers(queue.redis_queues_keys)  # `rq info` lists it
    assert flush_outbox(r, ledger.keys) == 0 and queue.count == 4


def test_enqueue_and_outbox_removal_are_one_transaction(make_ledger, r, monkeypatch):
    """A flush that dies before its transaction runs enqueues nothing (the next one
    enqueues each attempt once); one that runs leaves nothing behind in the outbox."""
    ledger = make_ledger(group_size=2, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    admission = ledger.admit()
    queue = episode_queue(r, ledger.keys)
    real = r.pipeline

    def dying(transaction=True, shard_hint=None):
        pipe = real(transaction=transaction, shard_hint=shard_hint)
        if transaction:
            def die(*a, **kw):
                raise ConnectionError("the dispatcher died here")
            pipe.execute = die
        return pipe

    monkeypatch.setattr(r, "pipeline", dying)
    try:
        flush_outbox(r, ledger.keys)
    except ConnectionError:
        pass
    monkeypatch.setattr(r, "pipeline", real)
    assert queue.count == 0 and r.llen(ledger.keys.outbox) == 2
    assert not any(r.exists(f"rq:job:{aid}") for aid in admission.attempt_ids)
    assert flush_outbox(r, ledger.keys) == 2
    assert sorted(queue.job_ids) == sorted(admission.attempt_ids)
    assert r.llen(ledger.keys.outbox) == 0 and flush_outbox(r, ledger.keys) == 0


def test_attempts_no_longer_queued_are_not_enqueued(make_ledger, r):
    ledger = make_ledger(group_size=1, max_concurrent_samples=8)
    ledger.submit(trivial_prompts(1))
    aid = ledger.admit().attempt_ids[0]
    ledger.start(aid, "w", "r", "b", 30)  # the job ran (e.g. the reconciler re-enqueued it)
    assert flush_outbox(r, ledger.keys) == 0
    assert episode_queue(r, ledger.keys).count == 0 and r.llen(ledger.keys.outbox) == 0


def test_the_queue_keys_the_ledger_names_are_rqs_own(make_ledger, r):
    """Scripts reach RQ's lists by name (move.lua): the names must be RQ's keys."""
    from rq import Queue

    from queue_rollout.ledger.keys import rq_queue_key

    keys = make_ledger().keys
    for name in (keys.rq_queue, keys.rq_replica_queue("host-gpu0")):
        assert rq_queue_key(name) == Queue(name, connection=r).key
